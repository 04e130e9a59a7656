"""Replay: rebuilt projections equal the live ones; re-derivation is exact; what-if is precise."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Connection

import controlplane.replay
from controlplane.commands import command_adapter
from controlplane.gateway.scenario import GatewayDriver, dispatch
from controlplane.policy_book import PolicyBook, load_overrides
from controlplane.replay import compare_with_live, state_at
from controlplane.replay.boundaries import whole_decisions_cut
from controlplane.replay.rebuild import rebuild_live
from controlplane.replay.verify import verify_decisions
from controlplane.runtime import open_store
from controlplane.service import accept
from controlplane.settings import Settings
from events import transaction
from events.canonical import canonical_json
from events.model import RecordedEvent, StreamAppend
from events.projections import load_all
from events.store import EventStore
from tests.cli_helpers import run_cli
from tests.factories import assess_memory, place_replica, register_model, register_node
from tests.factories import event as factory_event
from tests.fleet_helpers import run
from workers.queue import enqueue_commands
from workers.runner import work


def decide_through_the_queue(store: EventStore, payloads: list[dict]) -> None:
    connection = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    accepted = accept(store, [command_adapter.validate_python(p) for p in payloads])
    enqueue_commands(connection, Settings(batch_size=250), accepted)
    work(connection, [Settings.from_env().command_queue], burst=True, forking=False)


def thousand_commands() -> list[dict]:
    # Context lengths sweep across the fit boundary; half leave usable_fraction to the policy.
    return [assess_memory(f"r{i:04d}", max_live_tokens=1_024 + 64 * (i % 100),
                          usable_fraction=None if i % 2 else 0.95, model_name=f"m{i % 37}")
            for i in range(1_000)]


@pytest.fixture
def decided_store(store: EventStore) -> EventStore:
    decide_through_the_queue(store, thousand_commands())
    return store


@pytest.mark.slow
def test_dropping_and_rebuilding_the_projections_gives_the_same_state(
        decided_store: EventStore) -> None:
    with decided_store.engine.connect() as conn:
        before = load_all(conn)
    assert before["memory_fit"], "the decisions projected nothing"
    head = decided_store.head()[0]
    assert rebuild_live(decided_store).events_folded == head >= 2_000
    rebuilt = decided_store.read_all(from_position=head)
    assert [e.event_type for e in rebuilt] == ["ProjectionsRebuilt"]  # recorded, folds to nothing
    with decided_store.engine.connect() as conn:
        assert load_all(conn) == before
    assert compare_with_live(decided_store) == []


@pytest.mark.slow
def test_verify_reports_no_drift_after_a_thousand_decisions(decided_store: EventStore) -> None:
    report = verify_decisions(decided_store)
    assert report.decisions_checked == 1_000
    assert report.drifts == []


@pytest.mark.slow
def test_a_substituted_policy_parameter_lists_exactly_the_decisions_it_changes(
        decided_store: EventStore, tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"memory": {"usable_fraction": 0.6}}))
    report = verify_decisions(decided_store, PolicyBook(load_overrides(policy_file)))
    changed = {d.command_id for d in report.drifts}
    # Exactly the commands that left usable_fraction to the policy can change; those that
    # named their own fraction are untouched by a policy substitution.
    left_to_policy = {p["command_id"] for p in thousand_commands()
                      if "usable_fraction" not in p["deployment"]}
    assert changed == left_to_policy
    flipped = [d for d in report.drifts if d.recorded["outcome"] != d.rederived["outcome"]]
    assert flipped and all(d.rederived["outcome"] == "does_not_fit" for d in flipped)
    assert all("result" in d.changed_fields for d in report.drifts)
    assert verify_decisions(decided_store).drifts == []  # the live log is untouched


def test_status_at_a_position_equals_the_state_after_replaying_to_it(store: EventStore) -> None:
    decide_through_the_queue(store, thousand_commands()[:40])
    for position in (1, 40, 55, 80):
        folded = state_at(store, position).snapshot()
        by_hand: dict = {}
        for event in store.read_all(to_position=position):
            if event.event_type == "MemoryAssessed":
                by_hand[event.data["inputs"]["model_name"]] = event.data["result"]["fits"]
        assert {k: v["fits"] for k, v in folded.get("memory_fit", {}).items()} == by_hand


def test_appends_while_replaying_are_not_a_projection_difference(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    decide_through_the_queue(store, thousand_commands()[:5])
    read_live = controlplane.replay.load_all

    def live_then_another_decision(connection: Connection,
                                   unreadable_as_text: bool = False) -> dict[str, dict[str, Any]]:
        live = read_live(connection, unreadable_as_text)
        decide_through_the_queue(EventStore(store.engine), [assess_memory("late")])
        return live

    monkeypatch.setattr(controlplane.replay, "load_all", live_then_another_decision)
    assert compare_with_live(store) == []
    monkeypatch.undo()
    assert "model-late" in state_at(store).snapshot()["memory_fit"]  # it was decided
    assert compare_with_live(store) == []


@pytest.mark.usefixtures("embedded_queue")
def test_a_verify_cut_inside_a_decision_leaves_it_unchecked_rather_than_drifted(
        store: EventStore) -> None:
    run(store, register_node("n1", gpus=2), register_model(), place_replica("r1", tp=2))
    placement = [e.position for e in store.events_for_command("place-r1")
                 if e.event_type != "CommandAccepted"]
    assert len(placement) >= 2  # the placement and its reservation, in one decision
    inside = verify_decisions(store, to_position=placement[0])
    assert (inside.drifts, inside.decisions_unchecked) == ([], 1)
    whole = verify_decisions(store, to_position=placement[-1])
    assert (whole.drifts, whole.decisions_unchecked) == ([], 0)
    assert whole.decisions_checked == inside.decisions_checked + 1
    cli = run_cli("replay", "--verify", "--to", str(placement[0]), "--json")
    assert cli.exit_code == 0 and json.loads(cli.output)["decisions_unchecked"] == 1


@pytest.fixture(scope="module")
def demo_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite log of `fleetctl demo`: admission sheds, rollouts, scaling, all decided."""
    path = tmp_path_factory.mktemp("demo") / "demo.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLEET_DATABASE_URL", f"sqlite:///{path}")
        patch.delenv("FLEET_REDIS_URL", raising=False)
        assert run_cli("demo", "--trace-requests", "150").exit_code == 0
    return path


@pytest.fixture
def demo_store(demo_log: Path) -> Iterator[EventStore]:
    demo = open_store(f"sqlite:///{demo_log}")
    yield demo
    demo.engine.dispose()


def test_a_what_if_with_the_parameters_in_force_changes_no_decision(
        demo_store: EventStore, tmp_path: Path) -> None:
    recorded = list(demo_store.read_all())
    # The versions in force are copied into decisions: into a shed's facts, a rollout's result.
    assert any("policy_version" in reason["facts"] for e in recorded
               for reason in e.data.get("reasons", []))
    assert any("requirements_version" in (e.data.get("result") or {}) for e in recorded)
    same = tmp_path / "same.json"
    same.write_text(json.dumps({"admission": {}, "rollout": {}}))  # the demo keeps the defaults
    assert verify_decisions(demo_store, PolicyBook(load_overrides(same))).drifts == []
    # Other parameters still show: the rollouts' requirements change with them.
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rollout": {"min_sample_count": 7}}))
    drifts = verify_decisions(demo_store, PolicyBook(load_overrides(other))).drifts
    assert {d.event_type for d in drifts} >= {"RolloutStarted"}


def test_rebuilt_projections_are_compared_as_canonical_json(store: EventStore) -> None:
    decide_through_the_queue(store, [assess_memory("typed")])
    with store.engine.connect() as conn:
        live = load_all(conn)["memory_fit"]["model-typed"]
    assert live["fits"] is True
    retyped = canonical_json({**live, "fits": 1})  # equal to true in Python, not as stored
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE projections SET data = :data WHERE name = 'memory_fit'"),
                     {"data": retyped})
    differences = compare_with_live(store)
    assert [(d["projection"], d["key"]) for d in differences] == [("memory_fit", "model-typed")]


def test_a_rebuild_reports_and_records_the_rows_it_repaired(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, `replay --rebuild` rewrote a tampered row and then said the states were equal.
    decide_through_the_queue(store, [assess_memory("kept"), assess_memory("edited")])
    clean = rebuild_live(store)
    assert (clean.differences_repaired, clean.differences) == (0, [])
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE projections SET data = :data WHERE name = 'memory_fit' "
                          "AND key = 'model-edited'"), {"data": canonical_json({"fits": False})})
    monkeypatch.setenv("FLEET_DATABASE_URL", store.engine.url.render_as_string(False))
    result = run_cli("replay", "--rebuild")
    assert result.exit_code == 1, (result.output, result.stderr)
    assert "1 row(s) rewritten (memory_fit/model-edited)" in result.output
    [rebuilt] = [e for e in store.read_all() if e.event_type == "ProjectionsRebuilt"][-1:]
    assert rebuilt.data["differences_repaired"] == 1
    assert run_cli("replay").exit_code == 0  # repaired


def test_rederived_decisions_are_compared_as_canonical_json(store: EventStore) -> None:
    decide_through_the_queue(store, [assess_memory("typed")])
    with store.engine.begin() as conn:
        changed = conn.execute(text(
            "UPDATE events SET data = replace(data, :stored, :retyped)"
            " WHERE event_type = 'MemoryAssessed'"),
            {"stored": '"fits":true', "retyped": '"fits":1'}).rowcount
    assert changed == 1
    drifts = verify_decisions(store).drifts
    assert [(d.command_id, d.changed_fields) for d in drifts] == [("typed", ["result"])]


def cut_moves_back_from_inside(store: EventStore, first_type: str,
                               second_type: str) -> tuple[RecordedEvent, RecordedEvent]:
    """The first events of the two types, adjacent in one transaction: a cut at the first moves
    back before it, a cut at the second stays."""
    first = next(e for e in store.read_all() if e.event_type == first_type)
    second = next(e for e in store.read_all() if e.event_type == second_type)
    assert second.position == first.position + 1
    assert whole_decisions_cut(store, first.position) == first.position - 1
    assert whole_decisions_cut(store, second.position) == second.position
    return first, second


def test_a_cut_inside_a_decision_shows_the_state_before_it_never_a_half_applied_one(
        store: EventStore) -> None:
    # A placement appends ReplicaPlaced and GpusReserved in one transaction: folded to the
    # first alone, the replica was warming on a GPU that still counted as free.
    run(store, register_node("n1", gpus=2), register_model(), place_replica("r1"))
    placed, reserved = cut_moves_back_from_inside(store, "ReplicaPlaced", "GpusReserved")
    cut = json.loads(run_cli("replay", "--to", str(placed.position), "--json").output)
    assert (cut["position"], cut["requested_position"]) == (placed.position - 1, placed.position)
    assert "r1" not in cut["state"].get("replica", {})
    status = json.loads(run_cli("status", "--at", str(placed.position), "--json").output)
    assert status["position"] == placed.position - 1
    whole = json.loads(run_cli("replay", "--to", str(reserved.position), "--json").output)
    assert whole["position"] == reserved.position and "requested_position" not in whole
    assert whole["state"]["replica"]["r1"]["state"] == "warming"


def test_a_cut_inside_an_effects_observations_shows_the_state_before_them(
        gateway: GatewayDriver) -> None:
    """A call's outcome and its budget settlement are recorded in one transaction: folded to
    the first alone, the operation was completed with its grant still reserved."""
    gateway.send(dispatch("alice", "k1"))
    store = gateway.store
    completed, _ = cut_moves_back_from_inside(store, "OperationCompleted", "BudgetSettled")
    status = json.loads(run_cli("status", "--at", str(completed.position), "--json").output)
    assert status["position"] == completed.position - 1
    before = state_at(store, completed.position - 1)
    operation = before.get("gateway_operation", "acme/k1")
    assert operation is not None and operation["state"] == "dispatching"


def test_an_effects_transactions_are_told_apart_when_the_clock_does_not_tick(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mark is a transaction of its own before the call; grouped by their time, a clock that
    did not tick had merged it with the outcome's, moving a cut at the mark back before it."""
    frozen = transaction.wall_clock()
    monkeypatch.setattr(transaction, "wall_clock", lambda: frozen)
    gateway.send(dispatch("alice", "k1"))
    store = gateway.store
    marked = next(e for e in store.read_all() if e.event_type == "OperationDispatching")
    completed = next(e for e in store.read_all() if e.event_type == "OperationCompleted")
    assert marked.recorded_at == completed.recorded_at and completed.position == marked.position + 1
    assert whole_decisions_cut(store, marked.position) == marked.position
    assert whole_decisions_cut(store, completed.position) == marked.position


def test_a_decision_longer_than_the_window_read_back_is_still_cut_whole(
        store: EventStore) -> None:
    store.append([StreamAppend("s/big", None, [factory_event(str(i), command_id="big")
                                               for i in range(300)])])
    store.append([StreamAppend("s/next", None, [factory_event("n", command_id="next")])])
    assert [whole_decisions_cut(store, p) for p in (0, 1, 150, 299, 300, 301, 999)] == [
        0, 0, 0, 0, 300, 301, 999]


def test_a_drift_of_an_events_type_or_stream_names_it(store: EventStore) -> None:
    # Only keys of the events' data were compared: such a drift listed no changed field.
    decide_through_the_queue(store, [assess_memory("typed")])
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE events SET event_type = 'MemoryAssessedX'"
                          " WHERE event_type = 'MemoryAssessed'"))
    assert [d.changed_fields for d in verify_decisions(store).drifts] == [["event_type"]]
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE events SET event_type = 'MemoryAssessed', stream_id = 'memory/x'"
                          " WHERE event_type = 'MemoryAssessedX'"))
    assert [d.changed_fields for d in verify_decisions(store).drifts] == [["stream_id"]]

