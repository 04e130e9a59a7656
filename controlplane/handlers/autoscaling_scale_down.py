"""Which replicas a scale-down may release, in order: the undecided placements charged first.

A scale-down never releases a replica in place of a placement it issued and has not decided yet:
those cannot be withdrawn and will land, so the excess over the target is charged to them first
(they are the newest) and only the rest falls on replicas, warming before ready, newest placement
first. Whether a ready candidate may go while admitted requests hold its capacity is the
handler's rule (`handlers/autoscaling.py`).
"""

from __future__ import annotations

from typing import Any

from controlplane.policies.reasons import Reason


def _scale_down_order(pool: dict[str, Any], row: dict[str, Any]) -> list[str]:
    """Warming replicas before ready ones (they serve nothing yet); newest placement first."""
    def newest_first(ids: dict[str, int]) -> list[str]:
        return sorted(ids, key=lambda rid: (-row["members"].get(rid, -1), rid))
    return newest_first(pool["warming"]) + newest_first(pool["ready"])


def scale_down_candidates(pool: dict[str, Any], row: dict[str, Any],
                          excess: int) -> tuple[list[str], Reason | None]:
    """The replicas that may go to shed `excess` now, and why fewer go, if they do: the
    undecided placements are charged first (see this module's docstring)."""
    pending = row["pending_placements"]
    awaited = min(excess, len(pending))
    candidates = _scale_down_order(pool, row)[:excess - awaited]
    if not awaited:
        return candidates, None
    return candidates, Reason(
        "placements_pending",
        f"{awaited} of the {excess} replica(s) above the target are placements not decided yet: "
        "no replica is released in their place; an observation after they land releases them",
        {"excess_replicas": excess, "awaited_placements": awaited,
         "pending_placements": list(pending)})
