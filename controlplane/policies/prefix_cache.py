"""Scoped, block-granular prefix cache with a block budget and deterministic LRU (spec §1.4, §10).

A prompt is cut into complete blocks of `block_size_tokens`; the partial tail is never cached.
Each block is named by a SHA-256 that chains its parent's name and the scope (model, tokenizer,
adapter, tenant), so a block can only ever match the same tokens, after the same prefix, in the
same scope. Recency is a logical tick advanced once per store or lookup, never a clock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from controlplane.policies.prefix_cache_model import (
    SCOPE_FIELDS,
    SEPARATOR,
    CacheCounters,
    CachedBlock,
    CacheScope,
    HashedPrompt,
    LookupOutcome,
    MatchGranularity,
    PrefixCacheParams,
    PrefixCacheState,
    PrefixInvalidation,
    PrefixLookup,
    PrefixStore,
    Prompt,
    ScopeSelector,
    StoreOutcome,
    TokenPrompt,
)
from controlplane.policies.reasons import Reason, require

__all__ = [
    "CacheCounters", "CacheScope", "CachedBlock", "HashedPrompt", "LookupOutcome",
    "MatchGranularity", "PrefixCache", "PrefixCacheParams", "PrefixCacheState",
    "PrefixInvalidation", "PrefixLookup", "PrefixStore", "Prompt", "ScopeSelector", "StoreOutcome",
    "TokenPrompt", "block_hashes", "invalidate_prefixes", "lookup_prefix",
    "prefix_cache_state_from_plain", "store_prefix",
]


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate_params(params: PrefixCacheParams) -> None:
    require(_is_count(params.block_size_tokens) and params.block_size_tokens > 0,
            "block_size_not_positive", "block_size_tokens",
            "block_size_tokens must be a positive integer")
    capacity = params.capacity_blocks
    require(capacity is None or (_is_count(capacity) and capacity > 0),
            "capacity_blocks_not_positive", "capacity_blocks",
            "capacity_blocks must be a positive integer when set")
    require(params.match_granularity in tuple(MatchGranularity), "match_granularity_unknown",
            "match_granularity", "match_granularity must be block or entry")


def _validate_scope_field(value: object, field_name: str, blank_code: str) -> None:
    require(isinstance(value, str) and bool(value.strip()), blank_code, field_name,
            "scope fields may not be blank")
    # The separator inside a field would let two different scopes hash alike.
    require(SEPARATOR not in str(value), "scope_field_invalid", field_name,
            "scope fields may not contain the unit separator")


def _validate_scope(scope: CacheScope) -> None:
    for name in SCOPE_FIELDS:
        _validate_scope_field(getattr(scope, name), f"scope.{name}", "scope_field_blank")


def _blocks_of(prompt: Prompt, block_size: int) -> tuple[str, list[str], int]:
    """Validate a prompt; return its id kind, one id string per complete block, its length."""
    if isinstance(prompt, HashedPrompt):
        ids, total, kind = prompt.block_hash_ids, prompt.prompt_tokens, "hash_ids"
        require(isinstance(total, int) and total >= 0, "prompt_tokens_negative",
                "prompt.prompt_tokens", "prompt_tokens may not be negative")
        require(len(ids) == -(-total // block_size), "block_hash_ids_mismatch_prompt_length",
                "prompt.block_hash_ids", "one block hash id is needed per (partial) block")
        per_block = [str(hash_id) for hash_id in ids[: total // block_size]]
    else:
        ids = prompt.token_ids if isinstance(prompt, TokenPrompt) else tuple(prompt)
        total, kind = len(ids), "token_ids"
        complete = total - total % block_size
        per_block = [",".join(map(str, ids[start:start + block_size]))
                     for start in range(0, complete, block_size)]
    for index, item in enumerate(ids):
        require(isinstance(item, int) and not isinstance(item, bool) and item >= 0,
                "prompt_id_invalid", f"prompt.{kind}[{index}]", "ids must be non-negative integers")
    return kind, per_block, total


def block_hashes(scope: CacheScope, prompt: Prompt, block_size_tokens: int) -> tuple[str, ...]:
    """Chained block names: equal only for the same ids after the same prefix in the same scope."""
    kind, per_block, _ = _blocks_of(prompt, block_size_tokens)
    return _chain(scope, kind, per_block, block_size_tokens)


def _chain(scope: CacheScope, kind: str, per_block: list[str], block_size: int) -> tuple[str, ...]:
    hashes: list[str] = []
    parent = ""
    for ids in per_block:
        material = [*(getattr(scope, name) for name in SCOPE_FIELDS), str(block_size), kind,
                    parent, ids]
        parent = hashlib.sha256(SEPARATOR.join(material).encode("utf-8")).hexdigest()
        hashes.append(parent)
    return tuple(hashes)


def _prefix_key(scope: CacheScope, kind: str, per_block: list[str]) -> str:
    # The reference's whole-entry key (spec §1.4); hash ids are marked so that they can never
    # collide with a token list, which is digits and commas only.
    ids = ",".join(per_block) if kind == "token_ids" else "hash_ids:" + ",".join(per_block)
    material = [*(getattr(scope, name) for name in SCOPE_FIELDS), ids]
    return hashlib.sha256(SEPARATOR.join(material).encode("utf-8")).hexdigest()


class _Working:
    """A private mutable copy of a state; every operation runs on one, so there is one code path."""

    def __init__(self, state: PrefixCacheState) -> None:
        self.tick = state.tick
        self.blocks = dict(state.blocks)
        self.counters = state.counters

    def snapshot(self) -> PrefixCacheState:
        return PrefixCacheState(self.tick, MappingProxyType(dict(self.blocks)), self.counters)

    def touch(self, scope: CacheScope, hashes: Sequence[str], ends_entry: bool) -> int:
        """Mark a root chain as used now (inserting missing blocks); returns how many were new."""
        new_blocks = 0
        # Re-inserting deepest first keeps every child ahead of its parent in recency order.
        for depth in range(len(hashes) - 1, -1, -1):
            old = self.blocks.pop(hashes[depth], None)
            entry_end = ends_entry and depth == len(hashes) - 1
            if old is None:
                new_blocks += 1
                parent = hashes[depth - 1] if depth else None
                self.blocks[hashes[depth]] = CachedBlock(scope, parent, depth, self.tick,
                                                         entry_end)
            else:
                self.blocks[hashes[depth]] = replace(old, last_used_tick=self.tick,
                                                     ends_entry=old.ends_entry or entry_end)
        return new_blocks

    def evict(self, capacity: int) -> list[str]:
        """Drop least recently used blocks down to the budget; the first block is always a leaf,
        so a cached block's whole prefix stays cached."""
        evicted: list[str] = []
        while len(self.blocks) > capacity:
            victim = next(iter(self.blocks))
            del self.blocks[victim]
            evicted.append(victim)
        self.counters = replace(self.counters,
                                evicted_blocks=self.counters.evicted_blocks + len(evicted))
        return evicted


def _lookup(work: _Working, scope: CacheScope, prompt: Prompt,
            params: PrefixCacheParams) -> PrefixLookup:
    _validate_params(params)
    _validate_scope(scope)
    kind, per_block, prompt_tokens = _blocks_of(prompt, params.block_size_tokens)
    hashes = _chain(scope, kind, per_block, params.block_size_tokens)
    matched = entry_matched = 0
    for index, block_hash in enumerate(hashes):
        block = work.blocks.get(block_hash)
        if block is None or block.scope != scope:
            break
        matched = index + 1
        entry_matched = matched if block.ends_entry else entry_matched
    hit = matched if params.match_granularity is MatchGranularity.BLOCK else entry_matched
    reused = hit * params.block_size_tokens
    # A full hit still recomputes the last prompt token: its logits give the first output token.
    saved = min(reused, max(0, prompt_tokens - 1))
    work.tick += 1
    work.touch(scope, hashes[:hit], ends_entry=False)
    counters = work.counters
    work.counters = replace(counters, lookups=counters.lookups + 1,
                            hit_lookups=counters.hit_lookups + (hit > 0),
                            lookup_blocks=counters.lookup_blocks + len(hashes),
                            hit_blocks=counters.hit_blocks + hit,
                            lookup_prompt_tokens=counters.lookup_prompt_tokens + prompt_tokens,
                            saved_prefill_tokens=counters.saved_prefill_tokens + saved)
    cache_key = hashes[hit - 1] if hit else None
    prefix_key = _prefix_key(scope, kind, per_block[:hit]) if hit else None
    facts = {"hit_blocks": hit, "prompt_blocks": len(hashes), "reused_tokens": reused,
             "recompute_tokens": prompt_tokens - reused, "saved_prefill_tokens": saved,
             "block_size_tokens": params.block_size_tokens}
    reason = (Reason("prefix_blocks_reused", f"reused {hit} leading complete blocks",
                     {**facts, "cache_key": cache_key}) if hit else
              Reason("no_prefix_in_scope", "no leading complete block is cached in this scope",
                     facts))
    return PrefixLookup(LookupOutcome.HIT if hit else LookupOutcome.MISS, reused,
                        prompt_tokens - reused, hit, len(hashes), saved, cache_key, prefix_key,
                        (reason,))


def _store(work: _Working, scope: CacheScope, prompt: Prompt,
           params: PrefixCacheParams) -> PrefixStore:
    _validate_params(params)
    _validate_scope(scope)
    kind, per_block, _ = _blocks_of(prompt, params.block_size_tokens)
    if not per_block:
        reason = Reason("no_complete_block", "the prompt is shorter than one block",
                        {"block_size_tokens": params.block_size_tokens})
        return PrefixStore(StoreOutcome.NOTHING_TO_STORE, None, 0, 0, 0, (), (reason,))
    hashes = _chain(scope, kind, per_block, params.block_size_tokens)
    capacity = params.capacity_blocks
    kept = hashes if capacity is None else hashes[:capacity]
    work.tick += 1
    # Only a prompt stored whole marks an entry end; a truncated one is not a whole entry.
    new_blocks = work.touch(scope, kept, ends_entry=len(kept) == len(hashes))
    # The stored chain is now the most recent, so eviction never takes it.
    evicted = [] if capacity is None else work.evict(capacity)
    skipped = len(hashes) - len(kept)
    prefix_key = _prefix_key(scope, kind, per_block)
    reasons = [Reason("prefix_blocks_stored", f"{len(kept)} complete blocks cached",
                      {"stored_blocks": len(kept), "new_blocks": new_blocks,
                       "prefix_key": prefix_key})]
    if skipped:
        reasons.append(Reason("blocks_over_budget", "the prompt has more blocks than the budget",
                              {"skipped_blocks": skipped, "capacity_blocks": capacity}))
    if evicted:
        reasons.append(Reason("blocks_evicted", "least recently used blocks were evicted",
                              {"evicted_blocks": len(evicted), "capacity_blocks": capacity}))
    return PrefixStore(StoreOutcome.STORED, prefix_key, len(kept), new_blocks, skipped,
                       tuple(evicted), tuple(reasons))


def _invalidate(work: _Working, selector: ScopeSelector) -> PrefixInvalidation:
    wanted = {name: getattr(selector, name) for name in SCOPE_FIELDS
              if getattr(selector, name) is not None}
    require(bool(wanted), "selector_empty", "selector", "name at least one scope field")
    for name, value in wanted.items():
        _validate_scope_field(value, f"selector.{name}", "selector_field_blank")
    # Parent and child share a scope, so whole subtrees go together and no orphan is left.
    doomed = [block_hash for block_hash, block in work.blocks.items()
              if all(getattr(block.scope, name) == value for name, value in wanted.items())]
    for block_hash in doomed:
        del work.blocks[block_hash]
    work.counters = replace(work.counters,
                            invalidated_blocks=work.counters.invalidated_blocks + len(doomed))
    facts = {"removed_blocks": len(doomed), "selector": wanted}
    reason = (Reason("blocks_invalidated", f"{len(doomed)} blocks invalidated", facts) if doomed
              else Reason("nothing_to_invalidate", "no cached block matches the selector", facts))
    return PrefixInvalidation(len(doomed), (reason,))


def lookup_prefix(state: PrefixCacheState, scope: CacheScope, prompt: Prompt,
                  params: PrefixCacheParams) -> tuple[PrefixLookup, PrefixCacheState]:
    """Reuse the longest run of leading complete blocks cached in exactly this scope."""
    work = _Working(state)
    return _lookup(work, scope, prompt, params), work.snapshot()


def store_prefix(state: PrefixCacheState, scope: CacheScope, prompt: Prompt,
                 params: PrefixCacheParams) -> tuple[PrefixStore, PrefixCacheState]:
    """Cache the prompt's complete blocks within the block budget, evicting least recently used
    blocks; storing the same prompt again changes nothing but recency."""
    work = _Working(state)
    return _store(work, scope, prompt, params), work.snapshot()


def invalidate_prefixes(state: PrefixCacheState, selector: ScopeSelector
                        ) -> tuple[PrefixInvalidation, PrefixCacheState]:
    """Drop every block whose scope matches all the selector's set fields; others stay cached."""
    work = _Working(state)
    return _invalidate(work, selector), work.snapshot()


def prefix_cache_state_from_plain(plain: Mapping[str, Any]) -> PrefixCacheState:
    """Rebuild a state from its `to_plain` form, recency order included; the round trip is exact."""
    rows = sorted(plain["blocks"].items(),
                  key=lambda row: (row[1]["last_used_tick"], -row[1]["depth"], row[0]))
    blocks = {
        block_hash: CachedBlock(CacheScope(**block["scope"]), block["parent_hash"],
                                block["depth"], block["last_used_tick"], block["ends_entry"])
        for block_hash, block in rows
    }
    return PrefixCacheState(plain["tick"], MappingProxyType(blocks),
                            CacheCounters(**plain["counters"]))


class PrefixCache:
    """A convenience holder of one cache; it runs the same operations in place, without copying
    the state on every call, and `state` returns a snapshot."""

    def __init__(self, block_size_tokens: int = 4, capacity_blocks: int | None = None,
                 match_granularity: MatchGranularity = MatchGranularity.BLOCK,
                 state: PrefixCacheState | None = None) -> None:
        self.params = PrefixCacheParams(block_size_tokens, capacity_blocks, match_granularity)
        _validate_params(self.params)
        self._work = _Working(state or PrefixCacheState())

    @property
    def state(self) -> PrefixCacheState:
        return self._work.snapshot()

    def store(self, scope: CacheScope, prompt: Prompt) -> PrefixStore:
        return _store(self._work, scope, prompt, self.params)

    def lookup(self, scope: CacheScope, prompt: Prompt) -> PrefixLookup:
        return _lookup(self._work, scope, prompt, self.params)

    def invalidate(self, selector: ScopeSelector) -> PrefixInvalidation:
        return _invalidate(self._work, selector)
