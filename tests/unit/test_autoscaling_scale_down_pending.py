"""A scale-down charges its excess to the placements it has not decided yet before any replica:
once they land and the next observation releases them, the pool is at its target and has kept
as many ready replicas as the target allows."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.handlers.autoscaling_scale_down import scale_down_candidates


def scale_down(ready: set[str], warming: set[str], row: dict[str, Any], target: int) -> list[str]:
    """Release what `scale_down_candidates` allows now toward `target`; return what went."""
    desired = len(ready) + len(warming) + len(row["pending_placements"])
    candidates, _ = scale_down_candidates({"ready": dict.fromkeys(ready, 1),
                                           "warming": dict.fromkeys(warming, 1)},
                                          row, desired - target)
    ready -= set(candidates)
    warming -= set(candidates)
    return candidates


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 6), st.integers(0, 6), st.integers(0, 6), st.data())
def test_pending_placements_are_charged_first_and_the_pool_converges_keeping_ready_replicas(
        ready_count: int, warming_count: int, pending_count: int, data: st.DataObject) -> None:
    ready = {f"ready-{n}" for n in range(ready_count)}
    warming = {f"warming-{n}" for n in range(warming_count)}
    pending = [f"pending-{n}" for n in range(pending_count)]
    desired = ready_count + warming_count + pending_count
    if desired == 0:
        return
    target = data.draw(st.integers(0, desired - 1), label="target")
    placed = data.draw(st.permutations(sorted(ready | warming)), label="placement order")
    row = {"members": {rid: position for position, rid in enumerate(placed)},
           "pending_placements": pending}
    excess = desired - target

    first = scale_down(ready, warming, row, target)
    assert len(first) == max(0, excess - pending_count)
    # Warming replicas go before ready ones, and a ready one only past every pending placement.
    assert not (ready_count - len(ready)) or not warming
    # The placements land (newest of all), then the next observation sheds what is left.
    warming |= set(pending)
    row = {"members": {**row["members"], **{p: len(placed) + n for n, p in enumerate(pending)}},
           "pending_placements": []}
    scale_down(ready, warming, row, target)
    assert len(ready) + len(warming) == target
    assert len(ready) == min(ready_count, target)
