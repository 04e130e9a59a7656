"""Routing: longest cached prefix wins, ties by load; probing changes no cache; round-robin cycles."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.prefix_cache import CacheScope
from controlplane.simulation.routing import (
    BlockPrompt,
    ReplicaPrefixCache,
    Router,
    Routing,
    block_prompt,
)

SCOPE = CacheScope("model@r1", "tokenizer", "none", "default")
BLOCK = 4


@dataclass
class FakeReplica:
    replica_id: str
    load_tokens: int
    prefix_cache: ReplicaPrefixCache


def _prompt(*hash_ids: int, scope: CacheScope = SCOPE) -> BlockPrompt:
    return block_prompt(scope, hash_ids, BLOCK * len(hash_ids), BLOCK)


def _replica(name: str, load: int, *cached: BlockPrompt, capacity: int = 100) -> FakeReplica:
    replica = FakeReplica(name, load, ReplicaPrefixCache(BLOCK, capacity))
    for prompt in cached:
        replica.prefix_cache.store(prompt)
    return replica


def test_prefix_routing_picks_the_longest_cached_prefix_over_a_lighter_load() -> None:
    short = _replica("a", 0, _prompt(1, 2))
    long = _replica("b", 500, _prompt(1, 2, 3))
    chosen = Router(Routing.PREFIX).choose([short, long], _prompt(1, 2, 3, 4))
    assert chosen is long


def test_prefix_ties_go_to_the_least_loaded_then_the_first_id() -> None:
    busy, idle, idle_too = _replica("a", 900, _prompt(7)), _replica("c", 10), _replica("b", 10)
    assert Router(Routing.PREFIX).choose([busy, idle, idle_too], _prompt(1, 2)) is idle_too


def test_an_overloaded_replica_loses_its_prefix_affinity() -> None:
    hot = _replica("a", 10_000, _prompt(1, 2, 3))
    cold = [_replica(name, 100) for name in ("b", "c", "d")]
    assert Router(Routing.PREFIX).choose([hot, *cold], _prompt(1, 2, 3)) is cold[0]


def test_another_scope_never_matches_the_same_hash_ids() -> None:
    other = CacheScope("model@r2", "tokenizer", "none", "default")
    replica = _replica("a", 0, _prompt(1, 2, 3))
    assert replica.prefix_cache.cached_blocks(_prompt(1, 2, 3, scope=other)) == 0
    assert replica.prefix_cache.cached_blocks(_prompt(1, 2, 9)) == 2


def test_round_robin_takes_the_replicas_in_turn_whatever_they_cache() -> None:
    replicas = [_replica(name, 0, _prompt(1, 2)) for name in ("a", "b", "c")]
    router = Router(Routing.ROUND_ROBIN)
    assert [router.choose(replicas, _prompt(1, 2)).replica_id for _ in range(4)] == ["a", "b", "c", "a"]


def test_probing_every_replica_changes_no_cache_state() -> None:
    replica = _replica("a", 0, _prompt(1, 2, 3), _prompt(5, 6))
    before = replica.prefix_cache.cache.state
    Router(Routing.PREFIX).choose([replica], _prompt(1, 2, 3))
    assert replica.prefix_cache.cache.state == before


@settings(max_examples=40, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=5), min_size=1,
                        max_size=12),
       capacity=st.integers(1, 8))
def test_the_resident_index_always_equals_the_blocks_the_cache_holds(
        prompts: list[list[int]], capacity: int) -> None:
    cache = ReplicaPrefixCache(BLOCK, capacity)
    for ids in prompts:
        prompt = _prompt(*ids)
        cache.lookup(prompt)
        cache.store(prompt)
        assert cache.resident == set(cache.cache.state.blocks)
