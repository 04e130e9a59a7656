"""`fleetctl verify` detects edited, deleted, inserted and swapped rows at the first bad position."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from events.model import StreamAppend
from events.store import EventStore
from events.verify import verify_chain
from tests.cli_helpers import run_cli
from tests.factories import event


def seeded(store: EventStore) -> None:
    for index in range(10):
        store.append([StreamAppend("s/1", index, [event(f"e{index}", {"n": index})])])


def tamper(store: EventStore, *statements: str) -> None:
    with store.engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))


def report(store: EventStore):  # type: ignore[no-untyped-def]
    return verify_chain(store.read_all(raw=True), store.head())


def test_an_intact_log_verifies(store: EventStore) -> None:
    seeded(store)
    assert report(store).ok and report(store).events_checked == 10
    assert run_cli("verify").exit_code == 0


def test_an_edited_row_is_detected_at_its_position(store: EventStore) -> None:
    seeded(store)
    tamper(store, "UPDATE events SET data = replace(data, '3', '99') WHERE position = 4")
    result = report(store)
    assert (result.ok, result.first_bad_position, result.problem) == (False, 4, "hash_mismatch")
    cli = run_cli("verify", "--json")
    assert cli.exit_code == 1 and '"first_bad_position": 4' in cli.output


def test_an_edited_envelope_field_is_detected(store: EventStore) -> None:
    seeded(store)
    tamper(store, "UPDATE events SET actor = 'mallory' WHERE position = 6")
    assert report(store).first_bad_position == 6


def test_a_deleted_row_is_detected_at_its_position(store: EventStore) -> None:
    seeded(store)
    tamper(store, "DELETE FROM events WHERE position = 5")
    result = report(store)
    assert (result.ok, result.first_bad_position) == (False, 5)


def test_a_deleted_last_row_is_detected_against_the_head(store: EventStore) -> None:
    seeded(store)
    tamper(store, "DELETE FROM events WHERE position = 10")
    result = report(store)
    assert (result.ok, result.first_bad_position, result.problem) == (False, 10, "head_mismatch")


def test_an_inserted_row_is_detected_at_its_position(store: EventStore) -> None:
    seeded(store)
    # Make room at position 3 and forge a row there, copying a neighbour's hashes.
    tamper(store,
           "UPDATE events SET position = position + 100 WHERE position >= 3",
           "UPDATE events SET position = position - 99 WHERE position >= 103",
           "INSERT INTO events (position, stream_id, stream_version, event_id, event_type, "
           "schema_version, data, actor, tenant, occurred_at, recorded_at, prev_hash, hash) "
           "SELECT 3, 'forged', 1, 'forged-id', event_type, schema_version, data, actor, tenant, "
           "occurred_at, recorded_at, hash, hash FROM events WHERE position = 2")
    result = report(store)
    assert (result.ok, result.first_bad_position) == (False, 3)


def test_swapped_rows_are_detected_at_the_first_of_them(store: EventStore) -> None:
    seeded(store)
    tamper(store,
           "UPDATE events SET position = -7 WHERE position = 7",
           "UPDATE events SET position = 7 WHERE position = 8",
           "UPDATE events SET position = 8 WHERE position = -7")
    result = report(store)
    assert (result.ok, result.first_bad_position) == (False, 7)


@pytest.mark.parametrize("position", [1, 9])
def test_tampering_at_either_end_is_detected(store: EventStore, position: int) -> None:
    seeded(store)
    tamper(store, f"UPDATE events SET event_type = 'Forged' WHERE position = {position}")
    assert report(store).first_bad_position == position
