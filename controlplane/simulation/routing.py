"""Routing requests across ready replicas: prefix-aware (longest cached prefix) or round-robin.

Each replica keeps its own prefix cache (`policies.prefix_cache.PrefixCache`, block-level and
LRU within the replica's KV capacity). Probing which replica holds the longest prefix must not
touch any cache's recency, so each cache is mirrored by the set of block hashes it holds,
updated from what every store reports (stored chain, evicted blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeVar

from controlplane.policies.prefix_cache import (
    CacheScope,
    HashedPrompt,
    PrefixCache,
    PrefixLookup,
    block_hashes,
)

# Prefix affinity yields to balance when a replica holds more than this many times the mean load.
OVERLOAD_FACTOR = 2.0


class Routing(StrEnum):
    PREFIX = "prefix"
    ROUND_ROBIN = "round-robin"


@dataclass(frozen=True)
class BlockPrompt:
    """A prompt known by its block hash ids, in the cache scope of the release serving it."""

    scope: CacheScope
    prompt: HashedPrompt
    chain: tuple[str, ...]


def block_prompt(scope: CacheScope, hash_ids: Sequence[int], prompt_tokens: int,
                 block_size_tokens: int) -> BlockPrompt:
    """The prompt's chained block names in `scope` (computed once, probed on every replica)."""
    prompt = HashedPrompt(tuple(hash_ids), prompt_tokens)
    return BlockPrompt(scope, prompt, block_hashes(scope, prompt, block_size_tokens))


class ReplicaPrefixCache:
    """One replica's prefix cache plus a read-only index of the block hashes it holds."""

    def __init__(self, block_size_tokens: int, capacity_blocks: int) -> None:
        self.cache = PrefixCache(block_size_tokens, max(1, capacity_blocks))
        self.resident: set[str] = set()

    def cached_blocks(self, prompt: BlockPrompt) -> int:
        """How many leading blocks of `prompt` this replica holds; changes nothing."""
        matched = 0
        for block_hash in prompt.chain:
            if block_hash not in self.resident:
                break
            matched += 1
        return matched

    def lookup(self, prompt: BlockPrompt) -> PrefixLookup:
        """Reuse the cached prefix for a request about to run here (counts and recency move)."""
        return self.cache.lookup(prompt.scope, prompt.prompt)

    def store(self, prompt: BlockPrompt) -> None:
        """Cache the prompt's complete blocks once its prefill has computed them."""
        stored = self.cache.store(prompt.scope, prompt.prompt)
        self.resident.update(prompt.chain[:stored.stored_blocks])
        self.resident.difference_update(stored.evicted_block_hashes)


class RoutedReplica(Protocol):
    """What a router needs to know about a replica."""

    @property
    def replica_id(self) -> str: ...

    @property
    def load_tokens(self) -> int: ...

    @property
    def prefix_cache(self) -> ReplicaPrefixCache: ...


Replica = TypeVar("Replica", bound=RoutedReplica)


class Router:
    """Chooses a replica for each request; deterministic for the same replicas and requests."""

    def __init__(self, routing: Routing) -> None:
        self.routing = Routing(routing)
        self._turn = 0

    def choose(self, replicas: Sequence[Replica], prompt: BlockPrompt | None) -> Replica:
        """Prefix: the replica holding the longest cached prefix, ties by load then id (a
        replica over `OVERLOAD_FACTOR` × the mean load is passed over unless all are).
        Round-robin: the next replica in turn."""
        if not replicas:
            raise ValueError("no ready replica to route to")
        if self.routing is Routing.ROUND_ROBIN:
            chosen = replicas[self._turn % len(replicas)]
            self._turn += 1
            return chosen
        mean_load = sum(r.load_tokens for r in replicas) / len(replicas)
        limit = OVERLOAD_FACTOR * mean_load
        eligible = [r for r in replicas if r.load_tokens <= limit] or list(replicas)

        def score(replica: Replica) -> tuple[int, int, str]:
            matched = replica.prefix_cache.cached_blocks(prompt) if prompt is not None else 0
            return (-matched, replica.load_tokens, replica.replica_id)

        return min(eligible, key=score)
