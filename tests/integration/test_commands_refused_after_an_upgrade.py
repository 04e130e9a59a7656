"""A command accepted under looser validation than today's (an upgrade tightened it) neither
blocks its batch nor stops `replay --verify`.

Validation is tightened here the way an upgrade does it: today's `parse_command` refuses one
recorded command (its node id now holds a character ids may not), with pydantic's own error.
Before, deciding it failed the whole batch on every retry (its valid neighbours never decided),
and `replay --verify` stopped at it with "cannot be read", blaming tampering.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import controlplane.commands
import controlplane.replay.verify
from controlplane.commands import command_adapter
from controlplane.errors import OperationalError
from controlplane.replay.verify import verify_decisions
from controlplane.runtime import open_store
from controlplane.service import accept, decide, pending_command_ids
from events.model import NewEvent, StreamAppend, UnreadableEvent, derived_event_id
from events.store import EventStore
from tests.cli_helpers import run_cli
from tests.factories import register_node
from tests.fleet_helpers import decision, run

TIGHTENED = "register-n1"


def tighten_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Today's validation refuses the command `TIGHTENED` as it was recorded."""
    def today(payload: dict[str, Any]) -> Any:
        if payload.get("command_id") == TIGHTENED:
            return command_adapter.validate_python({**payload, "node_id": "rack1:n1"})
        return command_adapter.validate_python(payload)
    monkeypatch.setattr(controlplane.commands, "parse_command", today)


def test_a_recorded_command_todays_validation_refuses_is_rejected_and_its_batch_decided(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = accept(store, [command_adapter.validate_python(p)
                         for p in (register_node("n1"), register_node("n2"))])
    tighten_validation(monkeypatch)
    outcomes = decide(store, ids)
    assert [o.decided_now for o in outcomes] == [True, True]
    rejected = decision(store, TIGHTENED)
    assert (rejected.event_type, rejected.stream_id) == ("CommandRejected", "inbox")
    reason = rejected.data["reasons"][0]
    assert reason["code"] == "command_refused_by_validation"
    assert reason["facts"]["command_type"] == "RegisterNode"
    assert any("node_id" in problem for problem in reason["facts"]["problems"])
    assert rejected.data["inputs"]["node_id"] == "n1"  # the command as it was recorded
    assert decision(store, "register-n2").event_type == "NodeRegistered"
    # Re-derived by the same rules, the rejection is the same.
    report = verify_decisions(store)
    assert (report.decisions_checked, report.drifts) == (2, [])


def test_verify_goes_on_past_a_decided_command_todays_validation_refuses(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    run(store, register_node("n1"), register_node("n2"))
    tighten_validation(monkeypatch)
    report = verify_decisions(store)
    assert report.decisions_checked == 2  # the one after it checked too
    [drift] = report.drifts
    assert (drift.command_id, drift.refused_today, drift.explained) == (TIGHTENED, True, True)
    assert (drift.recorded["outcome"], drift.rederived["outcome"]) == ("registered", "rejected")
    assert report.unexplained == []


def test_replay_verify_names_a_refused_command_and_exits_0(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    source = tmp_path / "c.jsonl"
    source.write_text("\n".join(json.dumps(register_node(n)) for n in ("n1", "n2")))
    assert run_cli("submit", str(source)).exit_code == 0
    tighten_validation(monkeypatch)
    result = run_cli("replay", "--verify")
    assert result.exit_code == 0, result.stderr
    assert "1 of them of commands today's validation refuses" in result.output
    assert f"{TIGHTENED}: registered -> rejected" in result.output
    assert "refused by today's validation" in result.output


def from_a_newer_fleetctl(monkeypatch: pytest.MonkeyPatch, change: dict[str, Any]) -> None:
    """Today's version does not know what the command `TIGHTENED` holds (`change`): a newer
    fleetctl accepted it."""
    def today(payload: dict[str, Any]) -> Any:
        if payload.get("command_id") == TIGHTENED:
            return command_adapter.validate_python({**payload, **change})
        return command_adapter.validate_python(payload)
    monkeypatch.setattr(controlplane.commands, "parse_command", today)


@pytest.mark.parametrize("change", [{"type": "FutureCommand"}, {"future_field": 1}],
                         ids=["unknown-type", "unknown-field"])
def test_a_command_a_newer_fleetctl_accepted_is_left_for_a_worker_that_knows_it(
        store: EventStore, monkeypatch: pytest.MonkeyPatch, change: dict[str, Any]) -> None:
    """In a rolling upgrade an older worker may take a command only newer ones know: it must
    not reject it for good, nor hold up the rest of its batch."""
    ids = accept(store, [command_adapter.validate_python(p)
                         for p in (register_node("n1"), register_node("n2"))])
    with monkeypatch.context() as older:
        from_a_newer_fleetctl(older, change)
        outcomes = decide(store, ids)
        assert [(o.decided_now, o.events) for o in outcomes][0] == (False, ())
        assert outcomes[1].decided_now
        assert pending_command_ids(store) == [TIGHTENED]
    # A worker that knows it decides it.
    assert decide(store, [TIGHTENED])[0].decided_now
    assert decision(store, TIGHTENED).event_type == "NodeRegistered"


def test_verify_of_a_decision_only_a_newer_fleetctl_knows_says_so(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    run(store, register_node("n1"), register_node("n2"))
    from_a_newer_fleetctl(monkeypatch, {"type": "FutureCommand"})
    with pytest.raises(OperationalError, match="a newer fleetctl wrote this log"):
        verify_decisions(store)


def test_replay_and_status_at_refuse_a_log_holding_a_command_type_they_do_not_know(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A newer fleetctl's command (here `FutureCommand`) decided with events this version has no
    projector for: folded here, they had changed nothing, silently (a principal it restored
    still showed revoked)."""
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    store = open_store(sqlite_url)
    run(store, register_node("n1"))
    future = NewEvent(event_id=derived_event_id("f1", "accepted"), event_type="CommandAccepted",
                      data={"command": {"type": "FutureCommand", "command_id": "f1"},
                            "creates": []},
                      occurred_at="2026-11-30T12:00:00Z", command_id="f1")
    store.append([StreamAppend("inbox", None, [future])])
    position = store.head()[0]
    store.engine.dispose()
    for args in (["replay"], ["status", "--at", str(position)], ["replay", "--verify"]):
        result = run_cli(*args)
        assert result.exit_code == 3, (args, result.stderr)
        assert result.stderr == (
            f"error: event {position} accepts a 'FutureCommand' command, a type this fleetctl "
            "does not know: a newer fleetctl wrote this log; read it with that version\n")
    assert run_cli("status", "--at", str(position - 1)).exit_code == 0


def test_verify_of_a_decision_under_newer_rules_than_its_own_says_a_newer_fleetctl_wrote_it(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: reported as a decision today's rules cannot reproduce (exit 1), a false alarm.
    run(store, register_node("n1"))
    recorded = decision(store, "register-n1").data["rules_version"]
    monkeypatch.setattr(controlplane.replay.verify, "rules_version", lambda _: recorded - 1)
    with pytest.raises(OperationalError, match=f"rules version {recorded} of RegisterNode, "
                                               f"newer than this fleetctl's {recorded - 1}"):
        verify_decisions(store)


def test_a_rules_version_edited_upwards_is_named_as_an_edit(store: EventStore) -> None:
    run(store, register_node("n1"))
    with store.engine.begin() as conn:  # edited in Python: the same on SQLite and PostgreSQL
        position, data = conn.execute(text(
            "SELECT position, data FROM events WHERE event_type = 'NodeRegistered'")).one()
        conn.execute(text("UPDATE events SET data = :data WHERE position = :position"),
                     {"data": json.dumps({**json.loads(data), "rules_version": 99}),
                      "position": position})
    with pytest.raises(UnreadableEvent, match="no longer matches its hash"):
        verify_decisions(store)
