"""Admission records are bounded: settled ones are forgotten past their TTL or beyond the kept
maximum, by decisions that name what they forget, so replay rebuilds and re-derives exactly."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.commands import command_adapter
from controlplane.errors import InputError
from controlplane.policy_book import PolicyBook, validate_parameters
from controlplane.replay import compare_with_live, state_at
from controlplane.replay.verify import verify_decisions
from controlplane.service import accept, decide, pending_command_ids
from controlplane.workloads import at, inventory, model, placement, ready
from events.model import RecordedEvent
from events.store import EventStore

POOL = "chat"


def decide_all(store: EventStore, payloads: list[dict[str, Any]], book: PolicyBook) -> None:
    """Accept `payloads` and decide them in order with the policies of `book`."""
    for payload in payloads:
        accept(store, [command_adapter.validate_python(payload)])
        decide(store, pending_command_ids(store), policies=book)


def admission_book(**parameters: Any) -> PolicyBook:
    """Admission parameters in force for every decision, including the kept settled maximum."""
    return PolicyBook({"admission": {**validate_parameters("admission", {}), **parameters}})


def ready_pool(store: EventStore, book: PolicyBook) -> int:
    """One ready replica in the pool; returns the pool's live-token budget."""
    decide_all(store, [*inventory(1, 8), model(), placement("r1", POOL), ready("r1")], book)
    pool = state_at(store).get("pool", POOL)
    assert pool is not None
    budget: int = pool["live_token_budget"]
    return budget


def admit(request_id: str, tokens: int, second: float, deadline_second: float = 10_000,
          command_id: str | None = None) -> dict[str, Any]:
    return {"type": "AdmitRequest", "command_id": command_id or f"admit-{request_id}",
            "request_id": request_id, "pool_id": POOL, "prompt_tokens": tokens - 1,
            "max_output_tokens": 1, "deadline_at": at(deadline_second), "at": at(second)}


def release(request_id: str, second: float) -> dict[str, Any]:
    return {"type": "ReleaseRequest", "command_id": f"release-{request_id}",
            "request_id": request_id, "at": at(second)}


def requests_kept(store: EventStore) -> dict[str, str]:
    """Each request id the rebuilt projection still holds, with its recorded action."""
    state = state_at(store)
    return {key: row["action"] for key, row in state.items("admission_request")}


def pool_changes(store: EventStore) -> list[RecordedEvent]:
    return [e for e in store.read_all() if e.event_type == "PoolAdmissionChanged"]


def assert_replay_exact(store: EventStore, book: PolicyBook) -> None:
    report = verify_decisions(store, book)
    assert report.decisions_checked > 0 and report.drifts == []
    assert compare_with_live(store) == []


def test_the_admission_projection_keeps_at_most_max_settled_records_settled_requests(
        store: EventStore) -> None:
    book = admission_book(max_settled_records=5, max_tokens_per_request=1_000)
    ready_pool(store, book)
    traffic = []
    for index in range(30):
        if index % 3 == 0:  # over the per-request bound: shed, settled at once
            traffic.append(admit(f"x{index:02d}", 2_000, second=index))
        else:
            traffic += [admit(f"x{index:02d}", 100, second=index),
                        release(f"x{index:02d}", second=index)]
    decide_all(store, traffic, book)
    kept = requests_kept(store)
    assert sorted(kept) == ["x25", "x26", "x27", "x28", "x29"]  # the five settled last
    state = state_at(store)
    entities = [key for key, _ in state.items("entity") if key.startswith("request/")]
    assert entities == [f"request/{request_id}" for request_id in sorted(kept)]
    assert len(list(state.items("admission_settled"))) == 5
    pool = state.get("admission", POOL)
    assert pool is not None and (pool["settled_first"], pool["settled_next"]) == (25, 30)
    assert pool["decisions"] == {"admit": 20, "queue": 0, "shed": 10, "release": 20}
    forgotten = [request_id for e in pool_changes(store)
                 for request_id in e.data["result"]["forgotten_request_ids"]]
    assert forgotten == [f"x{index:02d}" for index in range(25)]  # oldest first, each once
    assert_replay_exact(store, book)


def test_a_forgotten_request_id_is_judged_afresh_and_replay_rederives_it(
        store: EventStore) -> None:
    book = admission_book(max_settled_records=2, max_tokens_per_request=1_000)
    ready_pool(store, book)
    decide_all(store, [admit("old", 2_000, second=1), admit("a", 2_000, second=2),
                       admit("b", 2_000, second=3)], book)
    assert "old" not in requests_kept(store)
    decide_all(store, [admit("old", 2_000, second=4, command_id="admit-old-again"),
                       admit("b", 2_000, second=5, command_id="admit-b-again")], book)
    again = {e.command_id: e for e in store.read_all() if e.stream_id.startswith("request/")}
    assert again["admit-old-again"].event_type == "RequestShed"  # a new decision, not a replay
    assert again["admit-b-again"].event_type == "AdmissionReplayed"  # still kept: answered again
    assert sorted(requests_kept(store)) == ["b", "old"]
    assert_replay_exact(store, book)


def test_settled_records_past_their_ttl_are_forgotten_by_the_next_pool_decision(
        store: EventStore) -> None:
    book = admission_book(record_ttl_seconds=60.0)
    ready_pool(store, book)
    decide_all(store, [admit("early", 100, second=0), release("early", second=5),
                       admit("live", 100, second=10), admit("late", 100, second=100)], book)
    assert requests_kept(store) == {"live": "admit", "late": "admit"}
    last = pool_changes(store)[-1]
    assert last.data["result"]["forgotten_request_ids"] == ["early"]
    codes = [reason["code"] for reason in last.data["reasons"]]
    assert codes == ["pool_admission_changed", "settled_records_forgotten"]
    assert last.data["reasons"][1]["facts"]["record_ttl_seconds"] == 60.0
    assert_replay_exact(store, book)


def test_an_id_judged_afresh_after_its_ttl_keeps_its_new_record_when_its_old_slot_goes(
        store: EventStore) -> None:
    book = admission_book(record_ttl_seconds=60.0, max_tokens_per_request=1_000)
    ready_pool(store, book)
    decide_all(store, [admit("x", 2_000, second=1), admit("y", 2_000, second=2),
                       admit("x", 500, second=100, command_id="admit-x-afresh")], book)
    last = pool_changes(store)[-1]
    # x's old slot is dropped with it, but x's row now belongs to the newer decision.
    assert last.data["result"]["forgotten_request_ids"] == ["y"]
    assert (last.data["result"]["settled_first"], last.data["result"]["settled_next"]) == (2, 2)
    assert requests_kept(store) == {"x": "admit"}
    decide_all(store, [release("x", second=101)], book)
    assert requests_kept(store) == {"x": "release"}
    assert_replay_exact(store, book)


def test_records_settled_and_forgotten_in_one_decision_leave_only_the_newest(
        store: EventStore) -> None:
    book = admission_book(max_settled_records=1, max_queued_requests=4,
                          max_tokens_per_request=100_000_000)
    budget = ready_pool(store, book)
    decide_all(store, [admit("big", budget, second=0),
                       admit("q1", 10, second=1, deadline_second=5),
                       admit("q2", 10, second=2, deadline_second=5),
                       release("big", second=20)], book)
    changed = pool_changes(store)[-1]
    # One release settles three records (the release, two queued past their deadline).
    assert changed.data["result"]["forgotten_request_ids"] == ["big", "q1"]
    assert requests_kept(store) == {"q2": "shed"}
    assert_replay_exact(store, book)


def test_operators_set_max_settled_records_and_a_nonsense_value_is_refused() -> None:
    assert validate_parameters("admission", {"max_settled_records": 5})["max_settled_records"] == 5
    assert validate_parameters("admission", {})["max_settled_records"] == 10_000
    for wrong in (0, -1, 1.5, "many", 100_001):
        with pytest.raises(InputError, match="max_settled_records"):
            validate_parameters("admission", {"max_settled_records": wrong})
