"""Autoscaling through the queue and the log: scale-ups issue placements that are decided and
warm up, scale-downs wait for the stabilisation window, and what-if shows a cooldown's effect."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from controlplane import handlers
from controlplane.commands import command_adapter
from controlplane.errors import InputError, SubmissionRejected
from controlplane.handlers import autoscaling
from controlplane.policy_book import PolicyBook, load_overrides
from controlplane.replay import state_at
from controlplane.replay.verify import verify_decisions
from controlplane.service import accept, decide, pending_command_ids
from controlplane.settings import Settings
from events.store import EventStore
from tests.cli_helpers import run_cli
from tests.factories import place_replica, register_model, register_node
from tests.fleet_helpers import assert_replay_exact, decision, run
from workers.queue import enqueue_commands
from workers.runner import work

POOL = "chat"
SERVICE = 100.0  # tokens/s per replica at full utilisation: demand = ceil(arrival / 100)
OBSERVE_LOAD_RULES = autoscaling.RULES_VERSIONS["ObserveLoad"]  # today's, recorded by decisions


pytestmark = pytest.mark.usefixtures("embedded_queue")






def at(second: int) -> str:
    return f"2026-11-30T14:{second // 60:02d}:{second % 60:02d}Z"


def epoch(second: int) -> float:
    """`at(second)` as the seconds since the epoch that decisions record."""
    return datetime.fromisoformat(at(second)).timestamp()


def observe(command_id: str, second: int, arrival: float, queued: int = 0) -> dict[str, Any]:
    return {"type": "ObserveLoad", "command_id": command_id, "pool_id": POOL, "at": at(second),
            "observations": [{"observed_at": at(second), "queued_tokens": queued,
                              "arrival_tokens_per_second": arrival}]}


def fleet(*replicas: str, **policy: Any) -> list[dict[str, Any]]:
    """A node, a model, the autoscaling policy, and `replicas` placed and ready in order."""
    payloads = [register_node("n1", gpus=6), register_model(),
                {"type": "SetPolicy", "command_id": "autoscaling-policy", "name": "autoscaling",
                 "parameters": {"service_tokens_per_second_per_replica": SERVICE,
                                "target_utilization": 1.0, **policy}}]
    for replica_id in replicas:
        payloads += [place_replica(replica_id),
                     {"type": "MarkReplicaReady", "replica_id": replica_id,
                      "command_id": f"ready-{replica_id}"}]
    return payloads


def pool(store: EventStore) -> dict[str, Any]:
    row = state_at(store).get("pool", POOL)
    assert row is not None
    return row






def test_a_scale_up_issues_placements_that_are_decided_and_start_warming(store: EventStore) -> None:
    run(store, *fleet("r1"))
    budget_before = pool(store)["live_token_budget"]
    run(store, observe("load-1", 10, arrival=250.0))
    scaled = decision(store, "load-1")
    assert (scaled.data["outcome"], scaled.data["result"]["target_replicas"]) == ("scale_up", 3)
    assert scaled.data["result"]["ready_capacity_tokens_per_second"] == SERVICE
    assert scaled.data["result"]["placements"] == [
        {"replica_id": "chat-as1", "command_id": "load-1:place:1"},
        {"replica_id": "chat-as2", "command_id": "load-1:place:2"}]
    for child in ("load-1:place:1", "load-1:place:2"):
        accepted, placed = store.events_for_command(child)[:2]
        assert accepted.causation_id == scaled.event_id
        assert placed.event_type == "ReplicaPlaced" and placed.causation_id == accepted.event_id
        assert placed.data["inputs"]["command"]["actor"] == "autoscaler"
    after = pool(store)
    assert sorted(after["warming"]) == ["chat-as1", "chat-as2"]
    assert after["live_token_budget"] == budget_before  # warming replicas serve nothing yet
    assert_replay_exact(store)


def test_placements_still_undecided_count_toward_desired_so_they_are_not_issued_twice(
        store: EventStore) -> None:
    run(store, *fleet("r1", scale_up_cooldown_seconds=0.0))
    # One submission: both observations are decided before the first one's placements are.
    run(store, observe("load-1", 10, arrival=250.0), observe("load-2", 11, arrival=250.0))
    second = decision(store, "load-2")
    assert second.data["outcome"] == "hold"
    assert second.data["result"]["desired_replicas_before"] == 3
    assert len([e for e in store.read_all() if e.event_type == "ReplicaPlaced"]) == 3
    row = state_at(store).get("autoscaler", POOL)
    assert row is not None and row["pending_placements"] == []
    assert_replay_exact(store)


def test_scale_down_waits_for_the_stabilization_window_then_releases_newest_first(
        store: EventStore) -> None:
    run(store, *fleet("r1", "r2", "r3", scale_down_stabilization_seconds=300.0))
    run(store, observe("low-0", 0, arrival=50.0), observe("low-200", 200, arrival=80.0))
    assert [decision(store, c).data["reasons"][0]["code"] for c in ("low-0", "low-200")] == [
        "scale_down_window_incomplete", "scale_down_window_incomplete"]
    run(store, observe("low-301", 301, arrival=150.0))
    scaled = decision(store, "low-301")
    # The window's peak (150 tokens/s -> 2 replicas) sets the target, not the newest alone.
    assert (scaled.data["outcome"], scaled.data["result"]["target_replicas"]) == ("scale_down", 2)
    assert scaled.data["result"]["releases"] == ["r3"]
    released = [e for e in store.events_for_command("low-301") if e.event_type == "ReplicaReleased"]
    assert [e.data["result"]["replica_id"] for e in released] == ["r3"]
    assert released[0].data["causes"] == [scaled.event_id]
    gpus = [e for e in store.events_for_command("low-301") if e.event_type == "GpusReleased"]
    assert gpus and all(e.data["causes"] == [released[0].event_id] for e in gpus)
    assert sorted(pool(store)["ready"]) == ["r1", "r2"]
    assert_replay_exact(store)


def test_a_scale_up_inside_the_cooldown_holds_and_what_if_a_shorter_cooldown_would_scale(
        store: EventStore, tmp_path: Path) -> None:
    run(store, *fleet("r1", scale_up_cooldown_seconds=120.0))
    run(store, observe("load-1", 10, arrival=150.0))
    run(store, observe("load-2", 40, arrival=350.0))
    held = decision(store, "load-2")
    assert (held.data["outcome"], held.data["rules_version"]) == ("hold", OBSERVE_LOAD_RULES)
    assert held.data["reasons"][0]["code"] == "scale_up_inside_cooldown"
    assert held.data["causes"] == [decision(store, "load-1").event_id]  # the change it waits on
    policy_file = tmp_path / "policy.json"
    # Only the cooldown changes: the recorded service rate and utilisation stay in force.
    policy_file.write_text(json.dumps({"autoscaling": {"scale_up_cooldown_seconds": 10.0}}))
    report = verify_decisions(store, PolicyBook(load_overrides(policy_file)))
    assert [d.command_id for d in report.drifts] == ["load-2"]
    drift = report.drifts[0]
    assert (drift.recorded["outcome"], drift.rederived["outcome"]) == ("hold", "scale_up")
    assert drift.rederived["result"]["target_replicas"] == 4
    assert "event_count" in drift.changed_fields  # it would also have issued two placements
    assert_replay_exact(store)


def test_follow_up_placements_are_enqueued_and_worked_by_a_real_worker(
        store: EventStore, queue_redis: Redis) -> None:
    run(store, *fleet("r1"))
    accepted = accept(store, [command_adapter.validate_python(observe("load-1", 10, 250.0))])
    enqueue_commands(queue_redis, Settings(), accepted)
    forking = not queue_redis.__class__.__module__.startswith("fakeredis")
    work(queue_redis, [Settings.from_env().command_queue], burst=True, forking=forking)
    assert pending_command_ids(store) == []
    assert sorted(pool(store)["warming"]) == ["chat-as1", "chat-as2"]
    assert_replay_exact(store)


def test_follow_ups_a_dead_delivery_did_not_enqueue_are_enqueued_when_it_is_delivered_again(
        store: EventStore, queue_redis: Redis) -> None:
    run(store, *fleet("r1"))
    accepted = accept(store, [command_adapter.validate_python(observe("load-1", 10, 250.0))])
    # Decided and committed, then the work horse died before it enqueued the placements.
    [outcome] = decide(store, accepted, enqueue=None)
    assert outcome.decided_now and len(pending_command_ids(store)) == 2
    enqueue_commands(queue_redis, Settings(), accepted)  # RQ's retry delivers the job again
    forking = not queue_redis.__class__.__module__.startswith("fakeredis")
    work(queue_redis, [Settings.from_env().command_queue], burst=True, forking=forking)
    assert pending_command_ids(store) == []
    assert sorted(pool(store)["warming"]) == ["chat-as1", "chat-as2"]
    assert_replay_exact(store)


def test_a_service_rate_that_serves_no_tokens_at_target_utilisation_is_refused_at_submit(
        store: EventStore) -> None:
    """Each parameter in range, but their product underflows: the autoscaler would divide by 0."""
    head = store.head()
    with pytest.raises(SubmissionRejected) as refused:
        run(store, {"type": "SetPolicy", "command_id": "tiny", "name": "autoscaling",
                    "parameters": {"service_tokens_per_second_per_replica": 5e-324,
                                   "target_utilization": 0.5}})
    [problem] = refused.value.problems
    assert problem.field == "parameters"
    assert "service_tokens_per_second_per_replica" in problem.message
    assert store.head() == head


def every_second(command_id: str, last: int, arrivals: dict[int, float]) -> dict[str, Any]:
    """An `ObserveLoad` at `last` with one observation per second for the ten seconds up to it
    (arrival 50 tokens/s, one replica's demand, unless `arrivals` says otherwise)."""
    return {"type": "ObserveLoad", "command_id": command_id, "pool_id": POOL, "at": at(last),
            "observations": [{"observed_at": at(second), "queued_tokens": 0,
                              "arrival_tokens_per_second": arrivals.get(second, 50.0)}
                             for second in range(last - 9, last + 1)]}


def scale_codes(store: EventStore, last_seconds: range) -> dict[int, str]:
    return {last: decision(store, f"obs-{last}").data["reasons"][0]["code"]
            for last in last_seconds}


def test_a_pool_observed_more_often_than_its_window_holds_still_scales_down(
        store: EventStore) -> None:
    """60 observations fill the 60 s stabilisation window; 20 are kept. Keeping only the newest
    20 never covered the window again, so the pool never scaled down."""
    run(store, *fleet("r1", "r2", "r3", scale_down_stabilization_seconds=60.0,
                      max_window_observations=20))
    run(store, *(every_second(f"obs-{last}", last, {}) for last in range(10, 200, 10)))
    codes = scale_codes(store, range(10, 200, 10))
    assert {codes[last] for last in range(10, 70, 10)} == {"scale_down_window_incomplete"}
    assert codes[70] == "scale_down_after_stable_window"
    assert decision(store, "obs-70").data["result"]["target_replicas"] == 1
    row = state_at(store).get("autoscaler", POOL)
    assert row is not None and len(row["window"]) <= 20
    assert_replay_exact(store)


def test_a_peak_merged_into_the_kept_window_still_holds_the_scale_down_while_inside_it(
        store: EventStore) -> None:
    """A one-second spike to three replicas' demand at 35 s is merged with its neighbours in
    the kept window (spans of 6.67 s: 34-39 s become one observation at 39 s), not forgotten:
    no scale-down until that observation leaves the 60 s window."""
    run(store, *fleet("r1", "r2", "r3", scale_down_stabilization_seconds=60.0,
                      max_window_observations=20))
    run(store, *(every_second(f"obs-{last}", last, {35: 300.0}) for last in range(10, 200, 10)))
    codes = scale_codes(store, range(10, 200, 10))
    assert {codes[last] for last in range(70, 100, 10)} == {"scale_down_demand_not_sustained"}
    assert codes[100] == "scale_down_after_stable_window"
    assert_replay_exact(store)


def test_a_merged_span_keeps_a_real_observation_so_the_scale_down_goes_to_the_real_peak(
        store: EventStore) -> None:
    """A backlog of two replicas' demand at 10 s and arrivals of two replicas' demand at 20 s
    fall in one span of the kept window (four kept, spans of 60 s). Spec §1.10: a scale-down
    goes to the highest demand in the window, 2. The span had merged into the largest queued
    tokens and arrival rate of either (2,000 queued and 200 tokens/s: demand 4, which no
    observation had), so the pool went to 4."""
    run(store, *fleet("r1", "r2", "r3", "r4", "r5", scale_down_stabilization_seconds=60.0,
                      max_window_observations=4, queue_drain_seconds=10.0,
                      scale_up_cooldown_seconds=0.0))
    for second, arrival, queued in ((0, 0.0, 0), (10, 0.0, 2_000), (20, 200.0, 0), (30, 0.0, 0),
                                    (40, 0.0, 0), (70, 0.0, 0)):
        run(store, observe(f"obs-{second}", second, arrival=arrival, queued=queued))
    scaled = decision(store, "obs-70")
    assert scaled.data["outcome"] == "scale_down"
    assert scaled.data["result"]["target_replicas"] == 2
    window = state_at(store).get("autoscaler", POOL)
    assert window is not None
    real = {(0, 0.0), (2_000, 0.0), (0, 200.0)}
    assert {(o["queued_tokens"], o["arrival_tokens_per_second"]) for o in window["window"]} <= real
    assert_replay_exact(store)


def test_a_scale_up_with_no_replica_to_copy_is_a_hold_that_starts_no_cooldown(
        store: EventStore) -> None:
    """The pool's first placement is refused (no node yet), so the autoscaler has nothing to
    copy: it holds. Recorded as a scale-up, it had started the cooldown and delayed the first
    real scale-up by it."""
    run(store, register_model(), {"type": "SetPolicy", "command_id": "autoscaling-policy",
                                  "name": "autoscaling",
                                  "parameters": {"service_tokens_per_second_per_replica": SERVICE,
                                                 "target_utilization": 1.0}},
        place_replica("r0"), observe("early", 10, arrival=250.0))
    early = decision(store, "early")
    assert (early.data["outcome"], early.data["result"]["placements"]) == ("hold", [])
    assert [r["code"] for r in early.data["reasons"]][-1] == "no_replica_template"
    assert early.data["result"]["last_scale_at_seconds"] is None
    run(store, register_node("n1", gpus=6), place_replica("r1"),
        {"type": "MarkReplicaReady", "replica_id": "r1", "command_id": "ready-r1"})
    run(store, observe("later", 20, arrival=250.0))  # well inside a 60 s cooldown from 10 s
    later = decision(store, "later")
    assert (later.data["outcome"], later.data["reasons"][0]["code"]) == (
        "scale_up", "scale_up_cleared_cooldown")
    assert_replay_exact(store)


def admit(request_id: str, tokens: int, second: int) -> dict[str, Any]:
    return {"type": "AdmitRequest", "command_id": f"admit-{request_id}", "request_id": request_id,
            "pool_id": POOL, "prompt_tokens": tokens - tokens // 4,
            "max_output_tokens": tokens // 4, "deadline_at": at(second + 600), "at": at(second)}


def admit_load(name: str, tokens: int, per_replica: int, second: int) -> list[dict[str, Any]]:
    """Requests `<name>-0`, `<name>-1`... admitted at `second`, holding `tokens` in all, none
    more than one replica holds (a request runs on one replica)."""
    sizes = [per_replica] * (tokens // per_replica) + ([tokens % per_replica] if tokens % per_replica else [])
    return [admit(f"{name}-{index}", size, second) for index, size in enumerate(sizes)]


def release_request(request_id: str, second: int) -> dict[str, Any]:
    return {"type": "ReleaseRequest", "command_id": f"release-{request_id}",
            "request_id": request_id, "at": at(second)}


def quiet_until_scale_down(store: EventStore) -> None:
    """Three ready replicas and a stabilisation window of low demand (1 replica's worth) that
    the next observation, at 301 s, completes."""
    run(store, *fleet("r1", "r2", "r3", scale_down_stabilization_seconds=300.0),
        {"type": "SetPolicy", "command_id": "admission-policy", "name": "admission",
         "parameters": {"max_tokens_per_request": 10_000_000}})
    run(store, observe("low-0", 0, arrival=50.0))


def test_a_scale_down_never_releases_capacity_that_admitted_requests_still_hold(
        store: EventStore) -> None:
    """Admitted requests hold more than two replicas' budget: releasing any ready replica would
    leave them over it, so the scale-down holds (no cooldown starts), citing the admission
    decision; once they are released, the next observation scales down."""
    quiet_until_scale_down(store)
    per_replica = pool(store)["ready"]["r1"]
    big = admit_load("big", 2 * per_replica + 1, per_replica, second=100)
    run(store, *big)
    assert {decision(store, a["command_id"]).event_type for a in big} == {"RequestAdmitted"}
    run(store, observe("low-301", 301, arrival=50.0))
    held = decision(store, "low-301")
    assert (held.data["outcome"], held.data["rules_version"]) == ("hold", OBSERVE_LOAD_RULES)
    assert held.data["result"]["releases"] == []
    assert held.data["result"]["target_replicas"] == 3
    assert held.data["result"]["last_scale_at_seconds"] is None
    code = held.data["reasons"][-1]
    assert code["code"] == "scale_down_held_by_admitted_load"
    assert code["facts"]["deferred_replicas"] == ["r3", "r2"]
    assert code["facts"]["live_tokens"] == 2 * per_replica + 1
    pool_admission = [e for e in store.events_for_command(big[-1]["command_id"])
                      if e.event_type == "PoolAdmissionChanged"]
    assert held.data["causes"] == [pool_admission[0].event_id]
    assert sorted(pool(store)["ready"]) == ["r1", "r2", "r3"]

    run(store, *(release_request(a["request_id"], 302) for a in big),
        observe("low-303", 303, arrival=50.0))
    scaled = decision(store, "low-303")
    assert (scaled.data["outcome"], scaled.data["result"]["releases"]) == ("scale_down", ["r3", "r2"])
    assert sorted(pool(store)["ready"]) == ["r1"]
    assert_replay_exact(store)


def test_a_scale_down_releases_the_replicas_the_admitted_load_does_not_need(
        store: EventStore) -> None:
    """Admitted requests fit in two replicas' budget but not one: of the two the demand would
    release, the newest goes and the next stays; the target says two."""
    quiet_until_scale_down(store)
    per_replica = pool(store)["ready"]["r1"]
    run(store, *admit_load("medium", per_replica + 1, per_replica, second=100))
    run(store, observe("low-301", 301, arrival=50.0))
    scaled = decision(store, "low-301")
    assert (scaled.data["outcome"], scaled.data["result"]["target_replicas"]) == ("scale_down", 2)
    assert scaled.data["result"]["releases"] == ["r3"]
    assert scaled.data["reasons"][-1]["facts"]["deferred_replicas"] == ["r2"]
    assert scaled.data["inputs"]["admitted"]["live_tokens"] == per_replica + 1
    assert sorted(pool(store)["ready"]) == ["r1", "r2"]
    assert_replay_exact(store)


def test_the_replicas_a_partial_scale_down_kept_go_once_the_load_is_released(
        store: EventStore) -> None:
    """The scale-down at 301 s releases r3 and keeps r2 for the admitted load. Once that load
    is released, the next observation releases r2: the partial release had restarted the
    stabilisation clock, and r2 stayed until 601 s, a window longer than when every release
    was held (the test above)."""
    quiet_until_scale_down(store)
    per_replica = pool(store)["ready"]["r1"]
    medium = admit_load("medium", per_replica + 1, per_replica, second=100)
    run(store, *medium, observe("low-301", 301, arrival=50.0))
    partial = decision(store, "low-301")
    assert partial.data["result"]["releases"] == ["r3"]
    assert partial.data["result"]["unfinished_scale_down_to"] == 1
    run(store, *(release_request(a["request_id"], 302) for a in medium),
        observe("low-303", 303, arrival=50.0))
    continued = decision(store, "low-303")
    assert (continued.data["outcome"], continued.data["result"]["releases"]) == (
        "scale_down", ["r2"])
    assert continued.data["reasons"][0]["code"] == "scale_down_continued"
    assert continued.data["result"]["unfinished_scale_down_to"] is None
    assert sorted(pool(store)["ready"]) == ["r1"]
    # Finished: a further scale-down waits out a window again (here none is asked for).
    run(store, observe("low-304", 304, arrival=50.0))
    assert decision(store, "low-304").data["outcome"] == "hold"
    assert_replay_exact(store)


def test_a_scale_down_is_not_continued_once_demand_came_back(store: EventStore) -> None:
    """Demand back at the desired count ends the unfinished scale-down: the kept replica stays
    even after the load is released, until a new full window of low demand."""
    quiet_until_scale_down(store)
    per_replica = pool(store)["ready"]["r1"]
    medium = admit_load("medium", per_replica + 1, per_replica, second=100)
    run(store, *medium, observe("low-301", 301, arrival=50.0))
    assert decision(store, "low-301").data["result"]["releases"] == ["r3"]
    busy = 2 * SERVICE - 1.0  # two replicas' worth at full utilisation
    run(store, observe("busy-302", 302, arrival=busy),
        *(release_request(a["request_id"], 303) for a in medium),
        observe("low-304", 304, arrival=50.0))
    assert decision(store, "busy-302").data["result"]["unfinished_scale_down_to"] is None
    held = decision(store, "low-304")
    assert (held.data["outcome"], held.data["result"]["releases"]) == ("hold", [])
    assert sorted(pool(store)["ready"]) == ["r1", "r2"]
    assert_replay_exact(store)


def test_a_smaller_budget_fraction_keeps_more_replicas_for_the_same_admitted_load(
        store: EventStore) -> None:
    """The budget the load must fit is the admission policy's: at half of the capacity, a load
    of one replica's worth needs two replicas."""
    quiet_until_scale_down(store)
    per_replica = pool(store)["ready"]["r1"]
    run(store, {"type": "SetPolicy", "command_id": "admission-half", "name": "admission",
                "parameters": {"max_tokens_per_request": 10_000_000,
                               "live_token_budget_fraction": 0.5}},
        admit("one-replica", per_replica // 2 + 1, second=100))
    assert decision(store, "admit-one-replica").event_type == "RequestAdmitted"
    run(store, observe("low-301", 301, arrival=50.0))
    scaled = decision(store, "low-301")
    assert scaled.data["result"]["releases"] == ["r3"]
    assert sorted(pool(store)["ready"]) == ["r1", "r2"]


def test_a_scale_down_recorded_under_the_previous_rules_drifts_as_an_upgrade_not_a_fault(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded as rules version 2 decided it (every victim released, admitted load or not),
    the scale-down re-derives differently under version 3: `replay --verify` reports the drift
    as one made under older rules, and nothing as unexplained."""
    monkeypatch.setattr(autoscaling, "_releasable",
                        lambda pool, victims, live_tokens, fraction: (victims, None))
    monkeypatch.setitem(handlers.RULES_VERSIONS, "ObserveLoad", 2)
    quiet_until_scale_down(store)
    per_replica = pool(store)["ready"]["r1"]
    run(store, *admit_load("big", 2 * per_replica + 1, per_replica, second=100),
        observe("low-301", 301, arrival=50.0))
    recorded = decision(store, "low-301")
    assert (recorded.data["rules_version"], recorded.data["result"]["releases"]) == (2, ["r3", "r2"])
    monkeypatch.undo()

    report = verify_decisions(store)
    assert [(d.command_id, d.rules_version, d.current_rules_version, d.older_rules)
            for d in report.drifts] == [("low-301", 2, OBSERVE_LOAD_RULES, True)]
    assert report.drifts[0].rederived["outcome"] == "hold"
    assert report.unexplained == []


def test_a_what_if_that_breaks_a_rule_with_the_recorded_parameters_is_refused_naming_the_version(
        store: EventStore, tmp_path: Path) -> None:
    """`min_replicas` 12 is a valid field, but above the recorded `max_replicas` (10) it breaks
    the policy's rule: the what-if is refused (exit 2), naming the version, not decided."""
    run(store, *fleet("r1", max_replicas=10), observe("load-1", 10, arrival=150.0))
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"autoscaling": {"min_replicas": 12}}))
    with pytest.raises(InputError, match="do not fit version 1 .*max_replicas may not be below"):
        verify_decisions(store, PolicyBook(load_overrides(policy_file)))
    policy_file.write_text(json.dumps({"autoscaling": {"min_replicas": 9}}))
    report = verify_decisions(store, PolicyBook(load_overrides(policy_file)))
    assert report.drifts[0].rederived["result"]["target_replicas"] == 9


def test_a_what_if_that_breaks_a_rule_with_the_default_parameters_names_the_defaults(
        store: EventStore, tmp_path: Path) -> None:
    """Decided under the defaults (no SetPolicy): the refusal names them, not a "version 0"
    the log never held."""
    run(store, *[p for p in fleet("r1") if p["type"] != "SetPolicy"],
        observe("load-1", 10, arrival=150.0))
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"autoscaling": {"min_replicas": 9}}))
    with pytest.raises(InputError, match=r"do not fit the defaults in force \(the log sets no "
                                         r"autoscaling policy\): .*max_replicas may not be below"):
        verify_decisions(store, PolicyBook(load_overrides(policy_file)))


def test_a_what_if_refused_against_the_log_leaves_a_rebuild_unwritten(
        store: EventStore, tmp_path: Path) -> None:
    # Before, --rebuild wrote its ProjectionsRebuilt event, then the what-if was refused.
    run(store, *fleet("r1", max_replicas=10), observe("load-1", 10, arrival=150.0))
    head = store.head()
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"autoscaling": {"min_replicas": 12}}))
    refused = run_cli("replay", "--rebuild", "--policy", str(policy_file))
    assert refused.exit_code == 2 and "do not fit version 1" in refused.stderr
    assert store.head() == head
    policy_file.write_text(json.dumps({"autoscaling": {"min_replicas": 9}}))
    rebuilt = run_cli("replay", "--rebuild", "--policy", str(policy_file), "--json")
    assert rebuilt.exit_code == 0, rebuilt.stderr
    assert json.loads(rebuilt.output)["rebuilt_events"] == head[0]
    assert store.head()[0] == head[0] + 1



def test_a_late_observation_is_decided_at_the_autoscalers_time_and_its_demand_still_counts(
        store: EventStore) -> None:
    """Observed at 40 s but decided after the observation at 50 s (as two workers may decide
    them): it was rejected as `observation_in_future`, its demand lost. Decided at 50 s, it
    joins the window, so its peak holds the scale-down until it leaves the 60 s window."""
    run(store, *fleet("r1", "r2", "r3", scale_down_stabilization_seconds=60.0))
    run(store, observe("obs-0", 0, arrival=300.0))
    run(store, observe("obs-50", 50, arrival=50.0))
    run(store, observe("late-40", 40, arrival=300.0))
    late = decision(store, "late-40")
    assert late.data["outcome"] != "rejected"
    assert [r for r in late.data["reasons"] if r["code"] == "observation_late"] == [{
        "code": "observation_late", "message": late.data["reasons"][-1]["message"],
        "facts": {"command_at_seconds": epoch(40), "decided_at_seconds": epoch(50)}}]
    window = state_at(store).get("autoscaler", POOL)
    assert window is not None
    assert epoch(40) in [o["timestamp_seconds"] for o in window["window"]]

    run(store, observe("obs-90", 90, arrival=50.0))
    assert decision(store, "obs-90").data["outcome"] == "hold"
    run(store, observe("obs-110", 110, arrival=50.0))
    assert decision(store, "obs-110").data["outcome"] == "scale_down"
    assert_replay_exact(store)
