"""A row edited outside the control plane is named, never a traceback.

`verify` finds the broken hash; the commands that read and fold the log (`replay` in every
form, `status --at`, `log`) say which event they cannot read and exit 3 with one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from events.model import UnreadableEvent
from events.store import EventStore
from tests.cli_helpers import run_cli
from tests.factories import place_replica, register_model, register_node
from tests.fleet_helpers import run


def readers(position: int) -> list[tuple[str, ...]]:
    """The commands that read the log, each reaching the event at `position`."""
    return [("replay",), ("replay", "--verify"), ("replay", "--to", str(position + 1)),
            ("replay", "--rebuild"), ("status", "--at", str(position + 1)),
            ("log", "--from", str(position - 1))]  # rows after --from


def placed_fleet(store: EventStore) -> int:
    """A node, a model and a placed replica; returns the position of its GpusReserved event."""
    run(store, register_node("n1"), register_model())
    run(store, place_replica("r1"))
    with store.engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT position FROM events WHERE event_type = 'GpusReserved'")).scalar_one())


@pytest.mark.parametrize(("data", "detail"), [
    ("'{}'", "cannot be folded (KeyError"),
    ("'not json'", "its data is not JSON"),
    ("'[1, 2]'", "its data is a JSON list, not an object"),
    ("replace(data, '\"g0\"', '\"g9\"')", "cannot be folded (KeyError: 'g9')"),
], ids=["empty-object", "not-json", "a-list", "unknown-gpu"])
def test_an_edited_event_is_named_by_every_command_that_reads_the_log(
        store: EventStore, data: str, detail: str) -> None:
    position = placed_fleet(store)
    with store.engine.begin() as conn:
        conn.execute(text(f"UPDATE events SET data = {data} WHERE position = {position}"))
    assert run_cli("verify").exit_code == 1
    for args in readers(position):
        if args[0] == "log" and "folded" in detail:
            continue  # `log` shows rows without folding them
        result = run_cli(*args)
        assert result.exit_code == 3, (args, result.stderr)
        assert f"event {position} (GpusReserved on node/n1) cannot be read" in result.stderr
        assert detail in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)


def test_a_fold_error_names_the_event_and_keeps_its_cause(store: EventStore) -> None:
    position = placed_fleet(store)
    with store.engine.begin() as conn:
        conn.execute(text(f"UPDATE events SET data = '{{}}' WHERE position = {position}"))
    from controlplane.replay import compare_with_live

    with pytest.raises(UnreadableEvent) as raised:
        compare_with_live(store)
    assert raised.value.position == position and isinstance(raised.value.__cause__, KeyError)


def without_replica_id(data: dict[str, Any]) -> dict[str, Any]:
    del data["command"]["replica_id"]
    return data


def of_unknown_type(data: dict[str, Any]) -> dict[str, Any]:
    data["command"]["type"] = "Nope"
    return data


def without_reasons(data: dict[str, Any]) -> dict[str, Any]:
    del data["reasons"]
    return data


@pytest.mark.parametrize(("event_type", "edit", "args"), [
    ("CommandAccepted", without_replica_id, ("replay", "--verify")),
    ("CommandAccepted", of_unknown_type, ("replay", "--verify")),
    ("CommandAccepted", lambda data: {}, ("replay", "--verify")),
    ("ReplicaPlaced", without_reasons, ("explain", "place-r1")),
], ids=["a-command-field-removed", "an-unknown-command-type", "no-command", "no-reasons"])
def test_re_deriving_or_explaining_an_edited_event_names_it(
        store: EventStore, tmp_path: Path, event_type: str,
        edit: Callable[[dict[str, Any]], dict[str, Any]], args: tuple[str, ...]) -> None:
    placed_fleet(store)
    with store.engine.begin() as conn:  # edited in Python: the same on SQLite and PostgreSQL
        position, data = conn.execute(text(
            "SELECT position, data FROM events WHERE event_type = :type "
            "AND command_id = 'place-r1'"), {"type": event_type}).one()
        conn.execute(text("UPDATE events SET data = :data WHERE position = :position"),
                     {"data": json.dumps(edit(json.loads(data))), "position": position})
    policy = tmp_path / "whatif.json"
    policy.write_text('{"memory": {"usable_fraction": 0.8}}', encoding="utf-8")
    runs = [args, ("replay", "--policy", str(policy))] if args[0] == "replay" else [args]
    for run_args in runs:
        result = run_cli(*run_args)
        assert result.exit_code == 3, (run_args, result.stderr)
        assert f"event {position} ({event_type} on " in result.stderr
        assert "cannot be read" in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, (run_args, result.stderr)


def test_an_edited_row_whose_text_is_not_utf8_is_named_by_every_command_that_reads_it(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite stores any bytes as text (PostgreSQL refuses such an edit): sqlite3 stopped the
    read of the whole chunk, so every reader exited 3 with "database failure" naming no row,
    `verify` too, and `log` failed even for rows around it."""
    from controlplane.runtime import open_store

    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    store = open_store(sqlite_url)
    position = placed_fleet(store)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE events SET data = CAST(X'7B2261223AFF7D' AS TEXT) "
                          f"WHERE position = {position}"))
    verified = run_cli("verify")
    assert verified.exit_code == 1, verified.stderr
    assert f"chain BROKEN at position {position}: hash_mismatch" in verified.output
    for args in readers(position):
        result = run_cli(*args)
        assert result.exit_code == 3, (args, result.stderr)
        assert f"event {position} (GpusReserved on node/n1) cannot be read: its data is not " \
               "JSON" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
    shown = run_cli("log", "--limit", "2", "--json")
    assert shown.exit_code == 0, shown.stderr
    store.engine.dispose()


def test_a_deleted_head_row_is_named_by_every_command_that_needs_it(store: EventStore) -> None:
    """`status` and `replay` printed only "NoResultFound: No row was found when one was
    required"; `submit` told the user to run `fleetctl init`, which does not restore it."""
    placed_fleet(store)
    head = store.head()
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM log_head"))
    try:
        for args in (("status",), ("replay",), ("status", "--at", "3")):
            result = run_cli(*args)
            assert result.exit_code == 3, (args, result.stderr)
            assert "the log has no head row (table log_head)" in result.stderr
            assert "removed outside fleetctl" in result.stderr
            assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
    finally:  # the PostgreSQL database outlives this test: put the head back
        with store.engine.begin() as conn:
            conn.execute(text("INSERT INTO log_head (id, position, hash) VALUES (1, :p, :h)"),
                         {"p": head[0], "h": head[1]})
