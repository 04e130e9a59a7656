"""Prefix cache (spec §1.4, example 04, tests/test_prefix_cache.py, §8, §10 block features)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.prefix_cache import (
    CacheScope,
    HashedPrompt,
    LookupOutcome,
    MatchGranularity,
    PrefixCache,
    PrefixCacheParams,
    PrefixCacheState,
    ScopeSelector,
    StoreOutcome,
    block_hashes,
    lookup_prefix,
    prefix_cache_state_from_plain,
    store_prefix,
)
from controlplane.policies.reasons import PolicyInputError, to_plain

ACME = CacheScope("model@abc", "tokenizer@1", "adapter:none", "acme")
EXAMPLE_ACME = CacheScope("model@abc", "tokenizer@7", "adapter:none", "acme")
EXAMPLE_BETA = CacheScope("model@abc", "tokenizer@7", "adapter:none", "beta")


def reference_cache(granularity: MatchGranularity = MatchGranularity.BLOCK) -> PrefixCache:
    cache = PrefixCache(block_size_tokens=2, match_granularity=granularity)
    cache.store(ACME, (10, 20, 30, 40, 50))
    return cache


def test_example_04_reuses_two_blocks_in_scope_and_nothing_for_another_tenant() -> None:
    cache = PrefixCache(block_size_tokens=4)
    stored = cache.store(EXAMPLE_ACME, (101, 102, 103, 104, 201, 202, 203, 204, 999))
    assert stored.stored_blocks == 2
    query = (101, 102, 103, 104, 201, 202, 203, 204, 301)
    same = cache.lookup(EXAMPLE_ACME, query)
    other = cache.lookup(EXAMPLE_BETA, query)
    assert (same.reused_tokens, same.recompute_tokens, same.hit_blocks) == (8, 1, 2)
    assert same.reasons[0].code == "prefix_blocks_reused"
    assert (other.reused_tokens, other.recompute_tokens, other.cache_key) == (0, 9, None)
    assert other.reasons[0].code == "no_prefix_in_scope"


def test_whole_prefix_key_matches_the_reference_digest() -> None:
    stored = PrefixCache(4).store(EXAMPLE_ACME, (101, 102, 103, 104, 201, 202, 203, 204))
    assert stored.prefix_key == "14e183f0acfe4533cbf3703988587791309eac2fb75c1d96b9de160e3c50beb3"


@pytest.mark.parametrize("granularity", list(MatchGranularity))
def test_reuses_only_complete_exact_prefix_blocks(granularity: MatchGranularity) -> None:
    decision = reference_cache(granularity).lookup(ACME, (10, 20, 30, 40, 99, 100))
    assert (decision.reused_tokens, decision.recompute_tokens, decision.hit_blocks) == (4, 2, 2)
    assert decision.outcome is LookupOutcome.HIT


def test_changed_token_forces_recompute_of_whole_entries_in_entry_mode() -> None:
    """The reference figure (0 reused) holds in ENTRY granularity, the reference's rule."""
    decision = reference_cache(MatchGranularity.ENTRY).lookup(ACME, (10, 20, 31, 40, 50))
    assert (decision.reused_tokens, decision.recompute_tokens) == (0, 5)
    assert decision.reasons[0].code == "no_prefix_in_scope"


def test_changed_token_still_reuses_the_matching_leading_block() -> None:
    """Deliberate change from the reference (spec §8): it reused 0 here because only whole entries
    matched; block granularity reuses the first block (10, 20), which is identical KV."""
    decision = reference_cache().lookup(ACME, (10, 20, 31, 40, 50))
    assert (decision.reused_tokens, decision.recompute_tokens, decision.hit_blocks) == (2, 3, 1)


def test_block_prefixes_of_a_stored_prompt_are_reusable() -> None:
    cache = PrefixCache(2)
    cache.store(ACME, (10, 20, 30, 40))
    assert cache.lookup(ACME, (10, 20, 99)).reused_tokens == 2
    entry = PrefixCache(2, match_granularity=MatchGranularity.ENTRY)
    entry.store(ACME, (10, 20, 30, 40))
    assert entry.lookup(ACME, (10, 20, 99)).reused_tokens == 0


@pytest.mark.parametrize("scope", [
    CacheScope("model@def", "tokenizer@1", "adapter:none", "acme"),
    CacheScope("model@abc", "tokenizer@2", "adapter:none", "acme"),
    CacheScope("model@abc", "tokenizer@1", "adapter:legal", "acme"),
    CacheScope("model@abc", "tokenizer@1", "adapter:none", "beta"),
])
def test_tenant_model_tokenizer_and_adapter_are_cache_boundaries(scope: CacheScope) -> None:
    decision = reference_cache().lookup(scope, (10, 20, 30, 40))
    assert (decision.reused_tokens, decision.hit_blocks) == (0, 0)


def test_short_partial_block_is_not_stored() -> None:
    cache = PrefixCache(2)
    stored = cache.store(ACME, (1,))
    assert (stored.outcome, stored.prefix_key, stored.stored_blocks) == (
        StoreOutcome.NOTHING_TO_STORE, None, 0)
    assert stored.reasons[0].code == "no_complete_block"
    assert cache.state.blocks == {}


def test_empty_lookup_reuses_and_recomputes_nothing() -> None:
    decision = reference_cache().lookup(ACME, ())
    assert (decision.reused_tokens, decision.recompute_tokens) == (0, 0)


def test_block_hash_chains_its_parent() -> None:
    left = block_hashes(ACME, (1, 2, 3, 4), 2)
    right = block_hashes(ACME, (9, 9, 3, 4), 2)
    assert left[1] != right[1]  # same tokens, different parent
    assert block_hashes(ACME, (1, 2, 3, 4, 5), 2) == left


def test_full_hit_still_recomputes_the_last_prompt_token() -> None:
    decision = reference_cache().lookup(ACME, (10, 20, 30, 40))
    assert (decision.reused_tokens, decision.recompute_tokens) == (4, 0)
    assert decision.saved_prefill_tokens == 3


def test_lru_evicts_the_least_recently_used_prompt_within_the_block_budget() -> None:
    cache = PrefixCache(2, capacity_blocks=4)
    cache.store(ACME, (1, 1, 2, 2))
    cache.store(ACME, (3, 3, 4, 4))
    cache.lookup(ACME, (1, 1, 2, 2))  # the first prompt is now the more recent
    stored = cache.store(ACME, (5, 5, 6, 6))
    assert len(stored.evicted_block_hashes) == 2
    assert set(stored.evicted_block_hashes) == set(block_hashes(ACME, (3, 3, 4, 4), 2))
    assert cache.lookup(ACME, (1, 1, 2, 2)).hit_blocks == 2
    assert cache.lookup(ACME, (3, 3, 4, 4)).hit_blocks == 0
    assert len(cache.state.blocks) == 4
    assert cache.state.counters.evicted_blocks == 2


def test_eviction_takes_leaves_first_so_a_shared_prefix_survives() -> None:
    cache = PrefixCache(2, capacity_blocks=3)
    cache.store(ACME, (1, 1, 2, 2))
    stored = cache.store(ACME, (7, 7, 8, 8))
    # The older prompt loses its tail block first, then its head; never a head before its tail.
    assert stored.evicted_block_hashes == block_hashes(ACME, (1, 1, 2, 2), 2)[::-1][:1]
    assert cache.lookup(ACME, (1, 1, 2, 2)).hit_blocks == 1


def test_a_prompt_longer_than_the_budget_keeps_only_its_leading_blocks() -> None:
    cache = PrefixCache(2, capacity_blocks=2)
    stored = cache.store(ACME, (1, 1, 2, 2, 3, 3))
    assert (stored.stored_blocks, stored.skipped_blocks) == (2, 1)
    assert [reason.code for reason in stored.reasons] == ["prefix_blocks_stored",
                                                          "blocks_over_budget"]


def test_invalidating_one_tenant_leaves_another_tenants_blocks_available() -> None:
    beta = CacheScope("model@abc", "tokenizer@1", "adapter:none", "beta")
    cache = reference_cache()
    cache.store(beta, (10, 20, 30, 40))
    result = cache.invalidate(ScopeSelector(tenant="acme"))
    assert result.removed_blocks == 2
    assert cache.lookup(ACME, (10, 20, 30, 40)).hit_blocks == 0
    assert cache.lookup(beta, (10, 20, 30, 40)).hit_blocks == 2


@pytest.mark.parametrize("selector", [
    ScopeSelector(model_revision="model@abc"),
    ScopeSelector(tokenizer_revision="tokenizer@1"),
    ScopeSelector(adapter_revision="adapter:none"),
    ScopeSelector(tenant="acme"),
])
def test_any_scope_field_can_invalidate(selector: ScopeSelector) -> None:
    cache = reference_cache()
    assert cache.invalidate(selector).reasons[0].code == "blocks_invalidated"
    assert cache.state.blocks == {}


def test_invalidating_an_unmatched_scope_removes_nothing() -> None:
    cache = reference_cache()
    result = cache.invalidate(ScopeSelector(model_revision="model@other"))
    assert (result.removed_blocks, result.reasons[0].code) == (0, "nothing_to_invalidate")
    assert cache.lookup(ACME, (10, 20, 30, 40)).hit_blocks == 2


def test_precomputed_block_hash_ids_match_like_tokens() -> None:
    """Mooncake-style input: one hash id per 512-token block, the last one partial."""
    cache = PrefixCache(512)
    cache.store(ACME, HashedPrompt((0, 1, 2, 3), 1600))  # three complete blocks, one partial
    decision = cache.lookup(ACME, HashedPrompt((0, 1, 7), 1100))
    assert (decision.hit_blocks, decision.reused_tokens, decision.recompute_tokens) == (
        2, 1024, 76)
    assert decision.saved_prefill_tokens == 1024


def test_hash_ids_and_token_ids_never_match_each_other() -> None:
    cache = PrefixCache(1)
    cache.store(ACME, (5, 6))
    assert cache.lookup(ACME, HashedPrompt((5, 6), 2)).hit_blocks == 0


def test_state_round_trips_through_plain_json() -> None:
    cache = PrefixCache(2, capacity_blocks=3)
    cache.store(ACME, (1, 1, 2, 2))
    cache.store(ACME, (1, 1, 3, 3))
    cache.lookup(ACME, (1, 1, 9))
    plain = json.loads(json.dumps(to_plain(cache.state), sort_keys=True))
    assert prefix_cache_state_from_plain(plain) == cache.state


def test_pure_functions_leave_the_input_state_untouched() -> None:
    params = PrefixCacheParams(block_size_tokens=2)
    empty = PrefixCacheState()
    _, stored = store_prefix(empty, ACME, (1, 2), params)
    _, looked = lookup_prefix(stored, ACME, (1, 2), params)
    assert empty.blocks == {} and empty.tick == 0
    assert stored.tick == 1 and looked.tick == 2
    assert len(stored.blocks) == 1


@pytest.mark.parametrize(("call", "code", "field"), [
    (lambda: PrefixCache(0), "block_size_not_positive", "block_size_tokens"),
    (lambda: PrefixCache(2, capacity_blocks=0), "capacity_blocks_not_positive",
     "capacity_blocks"),
    # Not integers: each had raised a bare TypeError at the first store, or counted True as 1.
    (lambda: PrefixCache(2.5), "block_size_not_positive", "block_size_tokens"),
    (lambda: PrefixCache(float("inf")), "block_size_not_positive", "block_size_tokens"),
    (lambda: PrefixCache(True), "block_size_not_positive", "block_size_tokens"),
    (lambda: PrefixCache(2, capacity_blocks=1.5), "capacity_blocks_not_positive",
     "capacity_blocks"),
    (lambda: PrefixCache(2).store(CacheScope("m", "t", "a", " "), (1, 2)), "scope_field_blank",
     "scope.tenant"),
    (lambda: PrefixCache(2).lookup(CacheScope("m", "t\x1fx", "a", "b"), (1, 2)),
     "scope_field_invalid", "scope.tokenizer_revision"),
    (lambda: PrefixCache(2).store(ACME, (1, -2)), "prompt_id_invalid", "prompt.token_ids[1]"),
    (lambda: PrefixCache(2).lookup(ACME, (1, -2)), "prompt_id_invalid", "prompt.token_ids[1]"),
    (lambda: PrefixCache(512).lookup(ACME, HashedPrompt((1,), 600)),
     "block_hash_ids_mismatch_prompt_length", "prompt.block_hash_ids"),
    (lambda: PrefixCache(2).invalidate(ScopeSelector()), "selector_empty", "selector"),
])
def test_invalid_inputs_are_refused_with_code_and_field(call: object, code: str,
                                                        field: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        call()  # type: ignore[operator]
    assert (error.value.code, error.value.field) == (code, field)


_tenants = st.sampled_from(["acme", "beta", "gamma"])
_prompts = st.lists(st.integers(0, 3), min_size=0, max_size=9).map(tuple)
_operations = st.lists(st.tuples(st.sampled_from(["store", "lookup"]), _tenants, _prompts),
                       max_size=25)


def _scope(tenant: str) -> CacheScope:
    return CacheScope("model@abc", "tokenizer@1", "adapter:none", tenant)


@settings(max_examples=150, deadline=None)
@given(_operations, st.sampled_from([None, 3, 6]))
def test_a_tenant_never_hits_another_tenants_blocks(
        operations: list[tuple[str, str, tuple[int, ...]]], capacity: int | None) -> None:
    cache = PrefixCache(2, capacity_blocks=capacity)
    stored_by_tenant: dict[str, set[str]] = {}
    for action, tenant, prompt in operations:
        if action == "store":
            cache.store(_scope(tenant), prompt)
            stored_by_tenant.setdefault(tenant, set()).update(
                block_hashes(_scope(tenant), prompt, 2))
        else:
            decision = cache.lookup(_scope(tenant), prompt)
            hit = block_hashes(_scope(tenant), prompt, 2)[:decision.hit_blocks]
            assert set(hit) <= stored_by_tenant.get(tenant, set())


@settings(max_examples=150, deadline=None)
@given(_operations, st.integers(1, 6))
def test_budget_holds_and_every_cached_block_keeps_its_whole_prefix(
        operations: list[tuple[str, str, tuple[int, ...]]], capacity: int) -> None:
    cache = PrefixCache(2, capacity_blocks=capacity)
    for action, tenant, prompt in operations:
        getattr(cache, action)(_scope(tenant), prompt)
        blocks = cache.state.blocks
        assert len(blocks) <= capacity
        for block in blocks.values():
            assert block.parent_hash is None or blocks[block.parent_hash].scope == block.scope


@settings(max_examples=100, deadline=None)
@given(_operations)
def test_replaying_the_same_operations_gives_the_same_state(
        operations: list[tuple[str, str, tuple[int, ...]]]) -> None:
    first, second = PrefixCache(2, capacity_blocks=4), PrefixCache(2, capacity_blocks=4)
    for cache in (first, second):
        for action, tenant, prompt in operations:
            getattr(cache, action)(_scope(tenant), prompt)
    assert json.dumps(to_plain(first.state), sort_keys=True) == json.dumps(
        to_plain(second.state), sort_keys=True)


@settings(max_examples=100, deadline=None)
@given(_prompts, _prompts)
def test_block_reuse_equals_the_common_complete_block_prefix_without_eviction(
        stored: tuple[int, ...], queried: tuple[int, ...]) -> None:
    cache = PrefixCache(2)
    cache.store(ACME, stored)
    common = 0
    while (common + 2 <= min(len(stored), len(queried))
           and stored[common:common + 2] == queried[common:common + 2]):
        common += 2
    decision = cache.lookup(ACME, queried)
    assert decision.reused_tokens == common
    assert decision.reused_tokens + decision.recompute_tokens == len(queried)


@settings(max_examples=150, deadline=None)
@given(_operations, st.integers(1, 6))
def test_eviction_takes_the_least_recently_used_blocks_first(
        operations: list[tuple[str, str, tuple[int, ...]]], capacity: int) -> None:
    params = PrefixCacheParams(2, capacity)
    state = PrefixCacheState()
    for action, tenant, prompt in operations:
        if action == "lookup":
            _, state = lookup_prefix(state, _scope(tenant), prompt, params)
            continue
        before = state
        decision, state = store_prefix(state, _scope(tenant), prompt, params)
        chain = set(block_hashes(_scope(tenant), prompt, 2))
        evicted = [before.blocks[h] for h in decision.evicted_block_hashes]
        survivors = [block for h, block in before.blocks.items()
                     if h in state.blocks and h not in chain]
        if evicted and survivors:
            assert (max((b.last_used_tick, -b.depth) for b in evicted)
                    <= min((b.last_used_tick, -b.depth) for b in survivors))


@settings(max_examples=100, deadline=None)
@given(_operations, st.sampled_from([None, 2, 5]))
def test_the_convenience_class_folds_exactly_like_the_pure_functions(
        operations: list[tuple[str, str, tuple[int, ...]]], capacity: int | None) -> None:
    params = PrefixCacheParams(2, capacity)
    cache = PrefixCache(2, capacity_blocks=capacity)
    state = PrefixCacheState()
    for action, tenant, prompt in operations:
        pure = store_prefix if action == "store" else lookup_prefix
        decision, state = pure(state, _scope(tenant), prompt, params)
        assert getattr(cache, action)(_scope(tenant), prompt) == decision
    assert cache.state == state
    assert list(cache.state.blocks) == list(state.blocks)
    restored = prefix_cache_state_from_plain(json.loads(json.dumps(to_plain(state))))
    assert list(restored.blocks) == list(state.blocks)
