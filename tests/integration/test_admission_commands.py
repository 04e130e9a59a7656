"""Admission through the queue and the log: budgets from ready replicas, FIFO promotion,
idempotency by request id, permanent sheds, and sheds that explain themselves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controlplane.explain import explain_id
from controlplane.policy_book import PolicyBook, load_overrides
from controlplane.replay import state_at
from controlplane.replay.verify import verify_decisions
from events.model import RecordedEvent
from events.store import EventStore
from tests.factories import place_replica, register_model, register_node
from tests.fleet_helpers import assert_replay_exact, decision, run

POOL = "chat"


pytestmark = pytest.mark.usefixtures("embedded_queue")




def events_of(store: EventStore, *event_types: str) -> list[RecordedEvent]:
    return [e for e in store.read_all() if e.event_type in event_types]




def at(second: int) -> str:
    return f"2026-11-30T13:{second // 60:02d}:{second % 60:02d}Z"


def admit(request_id: str, tokens: int, *, second: int = 0, command_id: str | None = None,
          deadline_second: int = 3_000, estimate: float = 0.0) -> dict[str, Any]:
    return {"type": "AdmitRequest", "command_id": command_id or f"admit-{request_id}",
            "request_id": request_id, "pool_id": POOL, "prompt_tokens": tokens - tokens // 4,
            "max_output_tokens": tokens // 4, "deadline_at": at(deadline_second),
            "estimated_queue_seconds": estimate, "at": at(second)}


def release(request_id: str, *, second: int = 0) -> dict[str, Any]:
    return {"type": "ReleaseRequest", "command_id": f"release-{request_id}-{second}",
            "request_id": request_id, "at": at(second)}


def set_admission(command_id: str = "admission-policy", **parameters: Any) -> dict[str, Any]:
    return {"type": "SetPolicy", "command_id": command_id, "name": "admission",
            "parameters": {"max_tokens_per_request": 10_000_000, **parameters}}


def ready_pool(store: EventStore, *replicas: str, **admission: Any) -> dict[str, int]:
    """Place and ready `replicas` in the pool; returns each one's KV capacity in tokens."""
    payloads = [register_node("n1", gpus=4), register_model(), set_admission(**admission)]
    for replica_id in replicas:
        payloads += [place_replica(replica_id),
                     {"type": "MarkReplicaReady", "replica_id": replica_id,
                      "command_id": f"ready-{replica_id}"}]
    run(store, *payloads)
    return {e.data["result"]["replica_id"]: e.data["result"]["kv_capacity_tokens"]
            for e in events_of(store, "ReplicaPlaced")}


def reason(event: RecordedEvent, index: int = 0) -> dict[str, Any]:
    found: dict[str, Any] = event.data["reasons"][index]
    return found






def test_the_budget_is_the_ready_replicas_kv_capacity_and_a_warming_replica_adds_none(
        store: EventStore) -> None:
    capacity = ready_pool(store, "r1")
    run(store, place_replica("r2"))  # warming: placed, never marked ready
    budget = capacity["r1"]
    run(store, admit("fill", budget, second=1), admit("one-more", 1, second=2))
    filled, queued = decision(store, "admit-fill"), decision(store, "admit-one-more")
    assert filled.data["outcome"] == "admit" and reason(filled)["facts"]["max_live_tokens"] == budget
    assert queued.data["outcome"] == "queue"
    assert reason(queued)["code"] == "queued_for_live_tokens"
    assert reason(queued)["facts"]["live_tokens"] == budget
    row = state_at(store).get("admission", POOL)
    assert row is not None and row["live_tokens"] == budget and row["queue"] == ["one-more"]
    assert_replay_exact(store)


def test_a_replica_becoming_ready_admits_the_queue_head_in_its_own_decision(
        store: EventStore) -> None:
    capacity = ready_pool(store, "r1", max_queued_requests=5)
    run(store, place_replica("r2"))  # warming
    capacity["r2"] = decision(store, "place-r2").data["result"]["kv_capacity_tokens"]
    budget = capacity["r1"]
    run(store, admit("fill", budget, second=1), admit("late", 10, second=2, deadline_second=6),
        admit("head", 200, second=3), admit("too-big", capacity["r2"], second=4),
        admit("small", 5, second=5))
    assert [decision(store, f"admit-{r}").data["outcome"]
            for r in ("fill", "late", "head", "too-big", "small")] == \
        ["admit", "queue", "queue", "queue", "queue"]
    run(store, {"type": "MarkReplicaReady", "replica_id": "r2", "command_id": "ready-r2",
                "at": at(10)})
    ready = next(e for e in store.events_for_command("ready-r2") if e.event_type == "ReplicaReady")
    by_request = {e.data["result"]["request_id"]: e for e in store.events_for_command("ready-r2")
                  if e.event_type in ("RequestAdmitted", "RequestShed")}
    # FIFO from the head: past its deadline is shed, the head fits and is admitted, and the
    # walk stops at the first that does not fit; the small one behind it may not overtake.
    assert list(by_request) == ["late", "head"]
    late, head = by_request["late"], by_request["head"]
    assert late.event_type == "RequestShed" and reason(late)["code"] == "deadline_passed_in_queue"
    assert head.event_type == "RequestAdmitted"
    assert reason(head)["code"] == "promoted_from_queue"
    assert reason(head)["facts"]["max_live_tokens"] == budget + capacity["r2"]
    assert head.data["causes"] == late.data["causes"] == [ready.event_id]  # caused by readiness
    row = state_at(store).get("admission", POOL)
    assert row is not None and row["queue"] == ["too-big", "small"]
    assert row["live_tokens"] == budget + 200
    assert state_at(store).get("admission_request", "head")["action"] == "admit"
    # Nothing queued: readiness decides no admission.
    run(store, release("too-big", second=11), release("small", second=11),
        place_replica("r3"), {"type": "MarkReplicaReady", "replica_id": "r3",
                              "command_id": "ready-r3", "at": at(12)})
    assert [e.event_type for e in store.events_for_command("ready-r3")] == \
        ["CommandAccepted", "ReplicaReady"]
    assert verify_decisions(store).drifts == []
    assert_replay_exact(store)


def test_a_larger_budget_fraction_admits_the_queue_head_under_the_new_policy_version(
        store: EventStore) -> None:
    capacity = ready_pool(store, "r1", max_queued_requests=5, live_token_budget_fraction=0.5)
    half = capacity["r1"] // 2
    run(store, admit("fill", half, second=1), admit("head", 100, second=2),
        admit("big", capacity["r1"], second=3))
    assert [decision(store, f"admit-{r}").data["outcome"] for r in ("fill", "head", "big")] == \
        ["admit", "queue", "queue"]
    run(store, {**set_admission("admission-policy-2", max_queued_requests=5,
                                live_token_budget_fraction=1.0), "at": at(10)})
    events = store.events_for_command("admission-policy-2")
    policy_set = next(e for e in events if e.event_type == "PolicySet")
    admitted = [e for e in events if e.event_type == "RequestAdmitted"]
    assert [e.data["result"]["request_id"] for e in admitted] == ["head"]  # FIFO; big waits
    assert admitted[0].data["policy"]["version"] == policy_set.data["result"]["version"] == 2
    assert reason(admitted[0])["facts"]["max_live_tokens"] == capacity["r1"]
    assert reason(admitted[0])["code"] == "promoted_from_queue"
    assert "new admission policy" in reason(admitted[0])["message"]
    assert admitted[0].data["causes"] == [policy_set.event_id]
    row = state_at(store).get("admission", POOL)
    assert row is not None and row["queue"] == ["big"] and row["live_tokens"] == half + 100
    # A version that does not grow the budget decides no admission.
    run(store, set_admission("admission-policy-3", max_queued_requests=4,
                             live_token_budget_fraction=1.0))
    assert [e.event_type for e in store.events_for_command("admission-policy-3")] == \
        ["CommandAccepted", "PolicySet"]
    assert verify_decisions(store).drifts == []
    assert_replay_exact(store)


def test_a_pool_with_only_warming_replicas_sheds_for_no_ready_capacity(store: EventStore) -> None:
    run(store, register_node("n1"), register_model(), place_replica("r1"), admit("early", 10))
    shed = decision(store, "admit-early")
    assert shed.event_type == "RequestShed" and reason(shed)["code"] == "no_ready_capacity"
    facts = reason(shed)["facts"]
    assert facts["live_token_budget"] == 0 and facts["warming_replicas"] == ["r1"]
    assert facts["retryable"] is True
    assert_replay_exact(store)


def test_a_request_over_its_token_bound_is_shed_for_the_bound_even_with_no_ready_capacity(
        store: EventStore) -> None:
    # Spec §1.8: the request's own bound comes before the pool's capacity. Before, a pool with
    # only warming replicas shed it as `no_ready_capacity`, retryable: a retry never can pass.
    run(store, register_node("n1"), register_model(), set_admission(max_tokens_per_request=1_000),
        place_replica("r1"), admit("big", 8_000), admit("small", 800))
    big, small = decision(store, "admit-big"), decision(store, "admit-small")
    assert [r["code"] for r in big.data["reasons"]] == ["token_bound_exceeded",
                                                         "scale_up_still_warming"]
    assert reason(big)["facts"]["retryable"] is False
    assert reason(big)["facts"]["max_tokens_per_request"] == 1_000
    assert reason(small)["code"] == "no_ready_capacity" and reason(small)["facts"]["retryable"]
    assert_replay_exact(store)


def test_a_request_no_single_replica_can_hold_is_shed_though_the_pooled_budget_would_fit_it(
        store: EventStore) -> None:
    """A request runs on one replica. Two replicas pool a budget of twice one's KV capacity,
    and a request between the two had been admitted: reserved where nothing can serve it."""
    capacity = ready_pool(store, "r1", "r2")
    one = max(capacity.values())
    run(store, admit("too-big", one + 1, second=1), admit("fits", one, second=2))
    shed = decision(store, "admit-too-big")
    assert (shed.event_type, reason(shed)["code"]) == ("RequestShed", "larger_than_any_replica")
    assert reason(shed)["facts"]["max_tokens_per_replica"] == one
    assert reason(shed)["facts"]["retryable"] is False
    assert reason(shed)["facts"]["live_token_budget"] == sum(capacity.values())
    assert decision(store, "admit-fits").event_type == "RequestAdmitted"
    assert_replay_exact(store)


def test_a_request_larger_than_every_warming_replica_is_shed_for_that_not_as_retryable(
        store: EventStore) -> None:
    """With only warming replicas a request is shed as retryable (capacity is on its way),
    unless none of them could ever hold it."""
    run(store, register_node("n1"), register_model(), set_admission(), place_replica("r1"))
    one = events_of(store, "ReplicaPlaced")[0].data["result"]["kv_capacity_tokens"]
    run(store, admit("too-big", one + 1), admit("waits", one))
    assert reason(decision(store, "admit-too-big"))["code"] == "larger_than_any_replica"
    assert reason(decision(store, "admit-too-big"))["facts"]["retryable"] is False
    assert reason(decision(store, "admit-waits"))["code"] == "no_ready_capacity"
    assert_replay_exact(store)


@pytest.mark.parametrize(("deadline", "outcome"), [("13:00:00.202", "queue"),
                                                   ("13:00:00.201999", "shed")])
def test_a_start_predicted_at_the_deadline_queues_to_the_microsecond(
        store: EventStore, deadline: str, outcome: str) -> None:
    # Spec §1.8: equality passes. At epoch seconds 13:00:00.002 + 0.2 s sums to a float just
    # past 13:00:00.202, so it was shed; a microsecond late is still late.
    budget = ready_pool(store, "r1")["r1"]
    edge = {**admit("edge", 10, estimate=0.2), "at": "2026-11-30T13:00:00.002Z",
            "deadline_at": f"2026-11-30T{deadline}Z"}
    run(store, admit("fill", budget, second=0), edge)
    judged = decision(store, "admit-edge")
    assert judged.data["outcome"] == outcome
    if outcome == "shed":
        assert reason(judged)["code"] == "predicted_wait_misses_deadline"
    assert_replay_exact(store)


def test_admission_figures_and_fifo_promotion_each_its_own_decision(store: EventStore) -> None:
    budget = ready_pool(store, "r1", max_queued_requests=2)["r1"]
    run(store, admit("big", budget - 100, second=1), admit("head", 300, second=2),
        admit("small", 50, second=3), admit("overflow", 20, second=4))
    outcomes = [decision(store, f"admit-{r}").data["outcome"]
                for r in ("big", "head", "small", "overflow")]
    assert outcomes == ["admit", "queue", "queue", "shed"]
    small = reason(decision(store, "admit-small"))
    assert small["facts"]["queue_position"] == 1  # it fits, but may not overtake the head
    overflow = reason(decision(store, "admit-overflow"))
    assert overflow["code"] == "live_budget_and_queue_full"
    assert (overflow["facts"]["live_tokens"], overflow["facts"]["queued_requests"]) == (budget - 100, 2)
    run(store, release("big", second=10))
    released = store.events_for_command("release-big-10")
    assert [(e.event_type, e.stream_id) for e in released[1:]] == [
        ("RequestReleased", "request/big"), ("RequestAdmitted", "request/head"),
        ("RequestAdmitted", "request/small"), ("PoolAdmissionChanged", f"pool/{POOL}")]
    release_id = released[1].event_id
    for promoted in released[2:4]:
        assert reason(promoted)["code"] == "promoted_from_queue"
        assert promoted.data["causes"] == [release_id]
    assert reason(released[1])["facts"]["freed_tokens"] == budget - 100
    assert [reason(e)["facts"]["live_tokens_after"] for e in released[2:4]] == [300, 350]
    row = state_at(store).get("admission", POOL)
    assert row is not None and (row["live_tokens"], row["queue"]) == (350, [])
    assert row["decisions"] == {"admit": 3, "queue": 2, "shed": 1, "release": 1}
    assert_replay_exact(store)


def test_a_repeated_request_id_gets_its_recorded_decision_and_a_changed_payload_is_refused(
        store: EventStore) -> None:
    ready_pool(store, "r1")
    run(store, admit("x", 500, second=1), admit("x", 500, second=5, command_id="admit-x-again"),
        admit("x", 501, second=6, command_id="admit-x-changed"))
    original = decision(store, "admit-x")
    again, changed = decision(store, "admit-x-again"), decision(store, "admit-x-changed")
    assert again.event_type == "AdmissionReplayed" and again.data["outcome"] == "admit"
    assert again.data["causes"] == [original.event_id]
    assert again.data["result"]["reserved_tokens"] == 500
    assert changed.data["outcome"] == "rejected"
    assert reason(changed)["code"] == "replay_payload_mismatch"
    row = state_at(store).get("admission", POOL)
    assert row is not None and row["live_tokens"] == 500  # reserved once
    assert_replay_exact(store)


def test_a_shed_is_permanent_until_its_record_expires(store: EventStore) -> None:
    ready_pool(store, "r1", max_tokens_per_request=1_000, record_ttl_seconds=60.0)
    run(store, admit("huge", 2_000, second=1), release("huge", second=2),
        admit("huge", 2_000, second=30, command_id="admit-huge-again"))
    assert reason(decision(store, "admit-huge"))["code"] == "token_bound_exceeded"
    refused = decision(store, "release-huge-2")
    assert refused.data["outcome"] == "rejected" and reason(refused)["code"] == "shed_is_permanent"
    assert decision(store, "admit-huge-again").data["outcome"] == "shed"
    assert decision(store, "admit-huge-again").event_type == "AdmissionReplayed"
    run(store, admit("huge", 800, second=200, command_id="admit-huge-after-ttl"))
    assert decision(store, "admit-huge-after-ttl").data["outcome"] == "admit"  # judged afresh
    assert_replay_exact(store)


def test_a_shed_links_to_the_warming_scale_up_and_explain_follows_it_to_the_placement(
        store: EventStore) -> None:
    budget = ready_pool(store, "r1", max_queued_requests=0)["r1"]
    run(store, {"type": "SetPolicy", "command_id": "autoscaling-policy", "name": "autoscaling",
                "parameters": {"service_tokens_per_second_per_replica": 100.0,
                               "target_utilization": 1.0}},
        {"type": "ObserveLoad", "command_id": "load-1", "pool_id": POOL, "at": at(1),
         "observations": [{"observed_at": at(1), "queued_tokens": 0,
                           "arrival_tokens_per_second": 200.0}]})
    run(store, admit("fill", budget, second=2), admit("late", 10, second=3))
    placement = decision(store, "load-1:place:1")
    assert placement.event_type == "ReplicaPlaced"
    shed = decision(store, "admit-late")
    facts = reason(shed)["facts"]
    assert (facts["live_token_budget"], facts["live_tokens"], facts["queued_requests"]) == (
        budget, budget, 0)
    assert facts["warming_replicas"] == ["chat-as1"] and facts["policy_version"] == 1
    assert reason(shed, 1)["code"] == "scale_up_still_warming"
    assert shed.data["causes"] == [placement.event_id]
    chain = explain_id(store, "admit-late")["chain"]
    kinds = [step["event_type"] for step in chain]
    assert kinds.index("RequestShed") < kinds.index("ReplicaPlaced") < kinds.index("ScaleDecided")
    scale = next(step for step in chain if step["event_type"] == "ScaleDecided")
    assert scale["command_id"] == "load-1" and scale["outcome"] == "scale_up"
    assert_replay_exact(store)


def test_what_if_a_smaller_budget_fraction_lists_exactly_the_admissions_it_changes(
        store: EventStore, tmp_path: Path) -> None:
    budget = ready_pool(store, "r1")["r1"]
    quarter = budget // 4
    run(store, *[admit(f"q{i}", quarter, second=i + 1) for i in range(4)])
    assert {decision(store, f"admit-q{i}").data["outcome"] for i in range(4)} == {"admit"}
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"admission": {"live_token_budget_fraction": 0.5,
                                                     "max_tokens_per_request": 10_000_000}}))
    report = verify_decisions(store, PolicyBook(load_overrides(policy_file)))
    # Every admission records the budget it used, so all four differ; re-derived on the recorded
    # state, only q2 and q3 no longer fit half the budget and would have queued.
    assert sorted(d.command_id for d in report.drifts) == [f"admit-q{i}" for i in range(4)]
    flipped = {d.command_id: (d.recorded["outcome"], d.rederived["outcome"])
               for d in report.drifts if d.recorded["outcome"] != d.rederived["outcome"]}
    assert flipped == {"admit-q2": ("admit", "queue"), "admit-q3": ("admit", "queue")}
    assert_replay_exact(store)


def test_a_queued_request_over_a_lowered_token_bound_is_shed_when_the_queue_moves(
        store: EventStore) -> None:
    capacity = ready_pool(store, "r1", max_queued_requests=5)
    run(store, admit("fill", capacity["r1"], second=1), admit("wide", 600, second=2),
        admit("narrow", 100, second=3))
    run(store, {**set_admission("admission-policy-2", max_queued_requests=5,
                                max_tokens_per_request=500), "at": at(4)})
    run(store, release("fill", second=5))
    decided = {e.data["result"]["request_id"]: e for e in store.events_for_command("release-fill-5")
               if e.event_type in ("RequestShed", "RequestAdmitted")}
    assert reason(decided["wide"])["code"] == "token_bound_exceeded"
    assert reason(decided["wide"])["facts"]["max_tokens_per_request"] == 500
    assert decided["narrow"].event_type == "RequestAdmitted"
    row = state_at(store).get("admission", POOL)
    assert row is not None and row["queue"] == [] and row["live_tokens"] == 100
    assert verify_decisions(store).drifts == []
    assert_replay_exact(store)


def test_a_queued_head_past_its_deadline_is_shed_at_the_door_not_left_blocking_the_pool(
        store: EventStore) -> None:
    """A head larger than the whole budget (half its one replica) waits for capacity until its
    deadline; after it, the next arrival sheds it and the request behind it is admitted, then
    the newcomer. Before, nothing walked the queue without a release, so every later request
    was shed as `live_budget_and_queue_full` with the pool's budget unused."""
    capacity = ready_pool(store, "r1", max_queued_requests=2, live_token_budget_fraction=0.5)
    budget = capacity["r1"] // 2
    run(store, admit("big", budget + 1, second=1, deadline_second=10),
        admit("next", 10, second=2), admit("turned-away", 10, second=3))
    assert [decision(store, f"admit-{r}").data["outcome"] for r in ("big", "next", "turned-away")] \
        == ["queue", "queue", "shed"]
    run(store, admit("later", 20, second=600))
    events = [e for e in store.events_for_command("admit-later")
              if e.event_type.startswith("Request")]
    assert [(e.data["result"]["request_id"], e.event_type, reason(e)["code"]) for e in events] == [
        ("later", "RequestAdmitted", "live_tokens_reserved"),
        ("big", "RequestShed", "deadline_passed_in_queue"),
        ("next", "RequestAdmitted", "promoted_from_queue")]
    row = state_at(store).get("admission", POOL)
    assert row is not None and (row["queue"], row["live_tokens"]) == ([], 30)
    assert_replay_exact(store)


def test_a_head_still_waiting_for_tokens_is_left_alone_by_a_newcomer(store: EventStore) -> None:
    capacity = ready_pool(store, "r1", max_queued_requests=5)
    run(store, admit("fill", capacity["r1"], second=1), admit("head", 10, second=2),
        admit("newcomer", 5, second=3))
    assert [e.event_type for e in store.events_for_command("admit-newcomer")] == [
        "CommandAccepted", "RequestQueued", "PoolAdmissionChanged"]
    assert state_at(store).get("admission", POOL)["queue"] == ["head", "newcomer"]
