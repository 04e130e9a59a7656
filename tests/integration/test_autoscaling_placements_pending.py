"""A scale-down never releases a replica in place of a placement the autoscaler issued and has
not decided yet: it holds that part of the excess (`placements_pending`), restarts no clock,
and a later observation releases the placements once they have landed, so the pool converges to
its target within [min_replicas, max_replicas].

Both scenarios are the reviewer's reproductions: one submission decides the observations before
the placements an earlier one issued (they are queued behind them)."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.replay import state_at
from events.model import RecordedEvent
from events.store import EventStore
from tests.factories import place_replica
from tests.fleet_helpers import assert_replay_exact, decision, run
from tests.integration.test_autoscaling_commands import (
    OBSERVE_LOAD_RULES,
    POOL,
    fleet,
    observe,
    pool,
)

pytestmark = pytest.mark.usefixtures("embedded_queue")


def scale_decisions(store: EventStore) -> list[RecordedEvent]:
    return [e for e in store.read_all() if e.event_type == "ScaleDecided"]


def assert_no_ready_replica_released_while_placements_pend(store: EventStore) -> None:
    """No decision released a ready replica while placements it had issued were undecided, and
    none recorded as a scale-down released nothing."""
    for scaled in scale_decisions(store):
        result = scaled.data["result"]
        pending = (result["desired_replicas_before"] - result["ready_replicas"]
                   - result["warming_replicas"])
        ready = scaled.data["inputs"]["pool"]["ready"]
        assert not (pending and set(result["releases"]) & set(ready)), scaled.command_id
        assert (result["action"] == "scale_down") == bool(result["releases"]), scaled.command_id


def assert_converged(store: EventStore, minimum: int, maximum: int) -> None:
    """Ready plus warming replicas equal the last decision's target, within the bounds."""
    now = pool(store)
    target = scale_decisions(store)[-1].data["result"]["target_replicas"]
    assert len(now["ready"]) + len(now["warming"]) == target
    assert minimum <= target <= maximum


def test_a_scale_down_decided_before_its_placements_keeps_the_ready_replica_serving(
        store: EventStore) -> None:
    """D1: one ready replica; a burst scales up to four (three placements issued); low demand
    a stabilisation window later is decided before the placements. It had released the ready
    replica in their place: three warming replicas, a budget of 0, traffic shed."""
    run(store, *fleet("r1", scale_down_stabilization_seconds=300.0))
    run(store, observe("burst", 600, arrival=400.0), observe("quiet", 1200, arrival=1.0))
    burst, quiet = decision(store, "burst"), decision(store, "quiet")
    assert burst.data["result"]["target_replicas"] == 4
    assert (quiet.data["outcome"], quiet.data["rules_version"]) == ("hold", OBSERVE_LOAD_RULES)
    assert quiet.data["result"]["releases"] == []
    assert quiet.data["result"]["target_replicas"] == 4  # what the pool still asks for
    pending = quiet.data["reasons"][-1]
    assert pending["code"] == "placements_pending"
    assert (pending["facts"]["excess_replicas"], pending["facts"]["awaited_placements"],
            pending["facts"]["policy_target_replicas"]) == (3, 3, 1)
    # A hold restarts no clock: the last scale change is still the burst's.
    assert quiet.data["result"]["last_scale_at_seconds"] == \
        burst.data["result"]["last_scale_at_seconds"]
    assert quiet.data["causes"] == [burst.event_id]
    landed = pool(store)
    assert (sorted(landed["ready"]), len(landed["warming"])) == (["r1"], 3)
    assert landed["live_token_budget"] > 0

    run(store, observe("later", 1500, arrival=1.0))
    later = decision(store, "later")
    assert later.data["outcome"] == "scale_down"
    assert later.data["result"]["releases"] == ["chat-as3", "chat-as2", "chat-as1"]
    assert (sorted(pool(store)["ready"]), pool(store)["warming"]) == (["r1"], {})
    assert_converged(store, 1, 8)
    assert_no_ready_replica_released_while_placements_pend(store)
    assert_replay_exact(store)


def test_a_pool_above_a_lowered_max_with_placements_pending_holds_then_converges_under_it(
        store: EventStore) -> None:
    """D1b: the maximum is lowered to 2 while the pool asks for 4 (one warming replica, three
    placements undecided). Each observation had been recorded as a scale-down releasing nothing
    but restarting the clock, and the pool ended with 3 replicas against a maximum of 2."""
    run(store, *fleet(scale_up_cooldown_seconds=0.0, scale_down_stabilization_seconds=0.0),
        place_replica("r1"))  # placed, never ready: warming throughout
    lowered = {"type": "SetPolicy", "command_id": "max-2", "name": "autoscaling",
               "parameters": {"service_tokens_per_second_per_replica": 100.0,
                              "target_utilization": 1.0, "scale_up_cooldown_seconds": 0.0,
                              "scale_down_stabilization_seconds": 0.0, "max_replicas": 2}}
    run(store, observe("burst", 10, arrival=400.0), lowered,
        *(observe(f"capped-{s}", s, arrival=400.0) for s in (20, 30, 40)))
    burst = decision(store, "burst")
    assert len(burst.data["result"]["placements"]) == 3
    for command_id in ("capped-20", "capped-30", "capped-40"):
        held = decision(store, command_id)
        assert (held.data["outcome"], held.data["result"]["releases"]) == ("hold", [])
        assert [r["code"] for r in held.data["reasons"]][-1] == "placements_pending"
        assert held.data["result"]["last_scale_at_seconds"] == \
            burst.data["result"]["last_scale_at_seconds"]
    row = state_at(store).get("autoscaler", POOL)
    assert row is not None and row["last_scale_event_id"] == burst.event_id
    assert len(pool(store)["warming"]) == 4  # r1 kept; the placements landed

    run(store, observe("after", 50, arrival=400.0))
    after = decision(store, "after")
    assert (after.data["outcome"], after.data["result"]["releases"]) == (
        "scale_down", ["chat-as3", "chat-as2"])
    assert sorted(pool(store)["warming"]) == ["chat-as1", "r1"]
    assert_converged(store, 1, 2)
    assert_no_ready_replica_released_while_placements_pend(store)
    assert_replay_exact(store)


def test_only_the_excess_beyond_the_pending_placements_releases_real_replicas(
        store: EventStore) -> None:
    """Three ready replicas and one placement pending when the maximum drops to 1: the pending
    placement is charged first, two ready replicas go now (not three), the placement lands and
    the next observation releases it, warming before ready."""
    run(store, *fleet("r1", "r2", "r3", scale_up_cooldown_seconds=0.0,
                      scale_down_stabilization_seconds=0.0))
    lowered = {"type": "SetPolicy", "command_id": "max-1", "name": "autoscaling",
               "parameters": {"service_tokens_per_second_per_replica": 100.0,
                              "target_utilization": 1.0, "scale_up_cooldown_seconds": 0.0,
                              "scale_down_stabilization_seconds": 0.0, "max_replicas": 1}}
    run(store, observe("burst", 10, arrival=400.0), lowered, observe("capped", 20, arrival=400.0))
    capped = decision(store, "capped")
    assert (capped.data["outcome"], capped.data["result"]["releases"]) == (
        "scale_down", ["r3", "r2"])
    assert capped.data["result"]["target_replicas"] == 2
    facts = capped.data["reasons"][-1]["facts"]
    assert (facts["excess_replicas"], facts["awaited_placements"]) == (3, 1)
    assert (sorted(pool(store)["ready"]), sorted(pool(store)["warming"])) == (["r1"], ["chat-as1"])

    run(store, observe("after", 30, arrival=400.0))
    assert decision(store, "after").data["result"]["releases"] == ["chat-as1"]
    assert (sorted(pool(store)["ready"]), pool(store)["warming"]) == (["r1"], {})
    assert_converged(store, 1, 1)
    assert_replay_exact(store)


def test_a_hold_with_no_replica_to_copy_names_the_policy_target_it_falls_short_of(
        store: EventStore) -> None:
    """D6: the pool's only placement was refused (no node), so it asks for 0 replicas, below
    min_replicas 1. The hold records that 0 (what the pool asks for, as every hold does) and
    says why it differs from the policy's target, which is within the bounds."""
    payloads: list[dict[str, Any]] = fleet()[1:]  # the model and the policy, but no node
    run(store, *payloads, place_replica("r0"), observe("early", 10, arrival=250.0))
    early = decision(store, "early")
    assert (early.data["outcome"], early.data["result"]["target_replicas"]) == ("hold", 0)
    reason = early.data["reasons"][-1]
    assert reason["code"] == "no_replica_template"
    assert (reason["facts"]["policy_target_replicas"], reason["facts"]["min_replicas"],
            reason["facts"]["max_replicas"]) == (3, 1, 8)
    assert_replay_exact(store)
