"""The prefix cache's vocabulary: scopes, prompts, parameters, state and outcomes (spec §1.4, §10).

The operations are in `controlplane.policies.prefix_cache`, which re-exports every name here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from controlplane.policies.reasons import Reason

SEPARATOR = "\x1f"
SCOPE_FIELDS = ("model_revision", "tokenizer_revision", "adapter_revision", "tenant")


@dataclass(frozen=True)
class CacheScope:
    """Everything that must be identical for cached KV to be reusable, tenant included."""

    model_revision: str
    tokenizer_revision: str
    adapter_revision: str
    tenant: str


@dataclass(frozen=True)
class ScopeSelector:
    """Which cached blocks to drop: those whose scope matches every field that is set."""

    model_revision: str | None = None
    tokenizer_revision: str | None = None
    adapter_revision: str | None = None
    tenant: str | None = None


@dataclass(frozen=True)
class TokenPrompt:
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class HashedPrompt:
    """A prompt known only by one precomputed id per block (the last may be partial)."""

    block_hash_ids: tuple[int, ...]
    prompt_tokens: int


Prompt = TokenPrompt | HashedPrompt | Sequence[int]


class MatchGranularity(StrEnum):
    BLOCK = "block"  # any matching leading complete blocks are reused
    ENTRY = "entry"  # only whole stored prompts are reused (the reference behaviour)


class LookupOutcome(StrEnum):
    HIT = "hit"
    MISS = "miss"


class StoreOutcome(StrEnum):
    STORED = "stored"
    NOTHING_TO_STORE = "nothing_to_store"


@dataclass(frozen=True)
class PrefixCacheParams:
    block_size_tokens: int = 4
    capacity_blocks: int | None = None  # None: unbounded, as in the reference
    match_granularity: MatchGranularity = MatchGranularity.BLOCK


@dataclass(frozen=True)
class CachedBlock:
    scope: CacheScope
    parent_hash: str | None
    depth: int
    last_used_tick: int
    ends_entry: bool


@dataclass(frozen=True)
class CacheCounters:
    lookups: int = 0
    hit_lookups: int = 0
    lookup_blocks: int = 0
    hit_blocks: int = 0
    lookup_prompt_tokens: int = 0
    saved_prefill_tokens: int = 0
    evicted_blocks: int = 0
    invalidated_blocks: int = 0


@dataclass(frozen=True)
class PrefixCacheState:
    """The whole cache as plain data. `blocks` is keyed by block hash and ordered least recently
    used first, deeper before shallower within one use, so its first block is always a leaf."""

    tick: int = 0
    blocks: Mapping[str, CachedBlock] = field(default_factory=lambda: MappingProxyType({}))
    counters: CacheCounters = CacheCounters()


@dataclass(frozen=True)
class PrefixLookup:
    outcome: LookupOutcome
    reused_tokens: int
    recompute_tokens: int
    hit_blocks: int
    prompt_blocks: int
    saved_prefill_tokens: int
    cache_key: str | None  # the deepest reused block's hash
    prefix_key: str | None  # the reused portion's whole-prefix key, as the reference names it
    reasons: tuple[Reason, ...]


@dataclass(frozen=True)
class PrefixStore:
    outcome: StoreOutcome
    prefix_key: str | None
    stored_blocks: int
    new_blocks: int
    skipped_blocks: int
    evicted_block_hashes: tuple[str, ...]
    reasons: tuple[Reason, ...]


@dataclass(frozen=True)
class PrefixInvalidation:
    removed_blocks: int
    reasons: tuple[Reason, ...]
