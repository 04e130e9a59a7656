"""`fleetctl verify` detects edited, deleted, inserted and swapped rows at the first bad position."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Connection

from controlplane.runtime import open_store
from events.model import StreamAppend
from events.store import EventStore
from events.verify import verify_log
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
    return verify_log(store)


# A forged row: a copy of row 1 under a new identity, at the position given.
FORGE_AT = ("INSERT INTO events (position, stream_id, stream_version, event_id, event_type, "
            "schema_version, data, actor, tenant, occurred_at, recorded_at, prev_hash, hash) "
            "SELECT {position}, 'forged', 1, 'forged-id', event_type, schema_version, data, actor,"
            " tenant, occurred_at, recorded_at, prev_hash, hash FROM events WHERE position = 1")


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


def checkpointed_store(store: EventStore) -> EventStore:
    small = EventStore(store.engine, checkpoint_every=4)
    for index in range(10):
        small.append([StreamAppend("s/1", None, [event(f"e{index}", {"n": index})])])
    return small


def test_checkpoints_carry_the_log_size_and_a_merkle_root_that_verify_checks(
        store: EventStore) -> None:
    small = checkpointed_store(store)
    checkpoints = [e for e in small.read_all() if e.event_type == "LogCheckpointed"]
    assert [c.data["log_size"] for c in checkpoints] == [c.position - 1 for c in checkpoints]
    assert len(checkpoints) == 3 and report(small).ok  # at positions 5, 10 and 14


def test_an_append_returns_exactly_its_own_events_when_it_crosses_a_checkpoint(
        store: EventStore) -> None:
    """The checkpoint an append adds is written but not returned: a caller unpacking its one
    event (the gateway's dispatch mark) failed whenever that event landed on a checkpoint."""
    small = EventStore(store.engine, checkpoint_every=4)
    for index in range(10):
        new = event(f"e{index}", {"n": index})
        (recorded,) = small.append([StreamAppend("s/1", None, [new])])
        assert recorded.event_id == new.event_id
    with small.transaction() as tx:
        crossing = [event(f"f{index}", {"n": index}) for index in range(3)]
        returned = tx.append([StreamAppend("s/2", None, crossing)])
        assert [e.event_id for e in returned] == [e.event_id for e in crossing]
        assert tx.appended[-1].event_type == "LogCheckpointed"
    assert len([e for e in small.read_all() if e.event_type == "LogCheckpointed"]) == 4
    assert report(small).ok


def test_checkpoints_stay_exact_when_writers_interleave_and_batches_cross_them(
        store: EventStore) -> None:
    # Each store remembers the hashes since the last checkpoint from its own commits; another
    # writer's append in between must make it read them from the log instead.
    first, second = (EventStore(store.engine, checkpoint_every=4) for _ in range(2))
    for index in range(12):
        writer = first if index % 3 else second
        events = [event(f"e{index}-{n}", {"n": n}) for n in range(1 + index % 3)]
        writer.append([StreamAppend(f"s/{index}", None, events)])
    checkpoints = [e for e in first.read_all() if e.event_type == "LogCheckpointed"]
    assert len(checkpoints) >= 5 and report(first).ok


@pytest.mark.parametrize("flushed_first", [False, True], ids=["buffered", "partly_written"])
def test_a_checkpoint_counts_its_transactions_rows_whether_written_or_buffered(
        store: EventStore, flushed_first: bool) -> None:
    # A store that does not know the hashes since the last checkpoint (another writer came in
    # between) reads the stored ones; its transaction's rows before the crossing are still
    # buffered, or already written (a read of its own events flushes them): they belong in the
    # Merkle root either way.
    first, second = (EventStore(store.engine, checkpoint_every=4) for _ in range(2))
    first.append([StreamAppend("s/a", None, [event("a0", {})])])
    second.append([StreamAppend("s/b", None, [event("b0", {})])])
    with first.transaction() as tx:
        tx.append([StreamAppend("s/c", None, [event("c0", {}, command_id="c")])])  # position 3
        if flushed_first:
            assert tx.events_for_commands(["c"])["c"]
        for index in range(1, 4):  # positions 4 to 6: the checkpoint after position 4
            tx.append([StreamAppend(f"s/c{index}", None, [event(f"c{index}", {})])])
    checkpoints = [e for e in first.read_all() if e.event_type == "LogCheckpointed"]
    assert checkpoints and checkpoints[0].data["from_position"] == 1
    assert report(first).ok


def test_a_rewritten_history_with_a_recomputed_chain_is_caught_by_the_next_checkpoint(
        store: EventStore) -> None:
    """An attacker who edits a row and re-hashes everything after it still fails the root."""
    from events.canonical import chain_hash
    from events.rows import header_of

    small = checkpointed_store(store)
    rows = list(small.read_all(raw=True))
    rows[1]["data"] = rows[1]["data"].replace('"n":1', '"n":100')
    prev = rows[0]["hash"]
    with small.engine.begin() as conn:
        for row in rows[1:]:
            row["prev_hash"] = prev
            row["hash"] = prev = chain_hash(prev, header_of(row), row["data"])
            conn.execute(text("UPDATE events SET data = :d, prev_hash = :p, hash = :h "
                              "WHERE position = :pos"),
                         {"d": row["data"], "p": row["prev_hash"], "h": row["hash"],
                          "pos": row["position"]})
        conn.execute(text("UPDATE log_head SET hash = :h"), {"h": prev})
    result = report(small)
    first_checkpoint = next(r["position"] for r in rows if r["event_type"] == "LogCheckpointed")
    assert (result.ok, result.problem, result.first_bad_position) == (
        False, "checkpoint_mismatch", first_checkpoint)


def test_a_forged_checkpoint_is_detected(store: EventStore) -> None:
    small = checkpointed_store(store)
    position = next(e.position for e in small.read_all() if e.event_type == "LogCheckpointed")
    tamper(small, f"UPDATE events SET data = replace(data, 'merkle_root\":\"', "
                  f"'merkle_root\":\"0') WHERE position = {position}")
    assert report(small).first_bad_position == position


def rechain(store: EventStore) -> None:
    """Redo every row's hash, link and the head, as whoever can write every row could."""
    from events.canonical import GENESIS_HASH, chain_hash
    from events.rows import header_of

    prev = GENESIS_HASH
    with store.engine.begin() as conn:
        for row in store.read_all(raw=True):
            digest = chain_hash(prev, header_of(row), row["data"])
            conn.execute(text("UPDATE events SET prev_hash = :p, hash = :h WHERE position = :pos"),
                         {"p": prev, "h": digest, "pos": row["position"]})
            prev = digest
        conn.execute(text("UPDATE log_head SET hash = :h"), {"h": prev})


@pytest.mark.parametrize("data", ["[]", "not json", "7"])
def test_a_checkpoint_whose_data_is_no_object_is_reported_not_a_crash(
        store: EventStore, data: str) -> None:
    # Before, verify raised (AttributeError, JSONDecodeError) and named no position.
    small = checkpointed_store(store)
    position = next(e.position for e in small.read_all() if e.event_type == "LogCheckpointed")
    tamper(small, f"UPDATE events SET data = '{data}' WHERE position = {position}")
    rechain(small)
    result = report(small)
    assert (result.ok, result.problem, result.first_bad_position) == (
        False, "checkpoint_mismatch", position)
    cli = run_cli("verify")
    assert cli.exit_code == 1 and "checkpoint_mismatch" in cli.output


def test_an_edited_head_hash_is_named_at_the_last_row_and_said_so(store: EventStore) -> None:
    seeded(store)
    tamper(store, "UPDATE log_head SET hash = '" + "a" * 64 + "'")
    result = report(store)
    assert (result.ok, result.problem, result.first_bad_position) == (False, "head_mismatch", 10)
    assert result.detail is not None and "head row was edited" in result.detail


def test_a_flipped_bit_in_a_hash_is_detected(store: EventStore) -> None:
    seeded(store)
    tamper(store, "UPDATE events SET hash = replace(hash, substr(hash, 1, 1), "
                  "CASE WHEN substr(hash, 1, 1) = 'a' THEN 'b' ELSE 'a' END) WHERE position = 3")
    assert report(store).first_bad_position in (3, 4)


def test_a_truncated_log_is_detected(store: EventStore) -> None:
    seeded(store)
    tamper(store, "DELETE FROM events WHERE position > 6")
    result = report(store)
    assert (result.ok, result.first_bad_position, result.problem) == (False, 7, "head_mismatch")


@pytest.mark.parametrize("position", [0, -5])
def test_a_row_inserted_before_position_one_breaks_the_chain(store: EventStore,
                                                            position: int) -> None:
    seeded(store)
    tamper(store, FORGE_AT.format(position=position))
    result = report(store)
    assert (result.ok, result.first_bad_position, result.problem) == (
        False, position, "position_gap")
    cli = run_cli("verify", "--json")
    assert cli.exit_code == 1 and json.loads(cli.output)["first_bad_position"] == position


def test_a_chained_row_added_past_the_head_breaks_the_chain(store: EventStore) -> None:
    from events.canonical import chain_hash
    from events.rows import header_of

    seeded(store)
    forged = {**list(store.read_all(raw=True))[-1], "position": 11, "stream_id": "forged",
              "event_id": "forged-id"}
    forged["prev_hash"], forged["hash"] = forged["hash"], chain_hash(
        forged["hash"], header_of(forged), forged["data"])
    with store.engine.begin() as conn:  # chained to row 10, but the head still says 10
        conn.execute(text(f"INSERT INTO events ({', '.join(forged)}) "
                          f"VALUES ({', '.join(':' + name for name in forged)})"), forged)
    result = report(store)
    assert (result.ok, result.first_bad_position, result.problem) == (False, 11, "head_mismatch")


def test_rows_appended_while_verifying_are_outside_the_check_not_a_broken_chain(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    seeded(store)
    other_writer = EventStore(store.engine)
    read_head = EventStore.head

    def head_then_another_append(self: EventStore, connection: Connection | None = None
                                 ) -> tuple[int, str]:
        head = read_head(self) if connection is None else read_head(self, connection)
        appended = read_head(other_writer)[0]
        other_writer.append([StreamAppend("s/late", None, [event(f"late{appended}")])])
        return head

    monkeypatch.setattr(EventStore, "head", head_then_another_append)
    result = report(store)
    assert (result.ok, result.events_checked, result.head_position) == (True, 10, 10)
    cli = run_cli("verify", "--json")
    assert cli.exit_code == 0, cli.output
    monkeypatch.undo()
    assert report(store).ok and report(store).events_checked == 12


@pytest.fixture
def sqlite_store(sqlite_url: str) -> Iterator[EventStore]:
    """A log on SQLite, whose columns will hold any type (PostgreSQL's hold only their own)."""
    event_store = open_store(sqlite_url)
    yield event_store
    event_store.engine.dispose()


@pytest.mark.parametrize("column", ["data", "actor"])
def test_a_field_stored_as_a_blob_is_a_hash_mismatch_at_its_position(
        sqlite_store: EventStore, column: str) -> None:
    seeded(sqlite_store)
    tamper(sqlite_store, f"UPDATE events SET {column} = CAST({column} AS BLOB) WHERE position = 4")
    result = report(sqlite_store)
    assert (result.ok, result.first_bad_position, result.problem) == (False, 4, "hash_mismatch")
    cli = run_cli("verify", "--json")
    assert cli.exit_code == 1 and json.loads(cli.output)["first_bad_position"] == 4


def test_a_deleted_head_row_is_reported_as_tampering(store: EventStore) -> None:
    """Not a database failure (exit 3): the head is what the chain is held to."""
    seeded(store)
    tamper(store, "DELETE FROM log_head")
    result = report(store)
    assert (result.ok, result.first_bad_position, result.problem) == (False, 0, "head_mismatch")
    cli = run_cli("verify")
    assert cli.exit_code == 1 and "head_mismatch" in cli.output


def rewrite_from(store: EventStore, position: int) -> None:
    """Edit the row at `position` and redo the chain after it and the head, as whoever can
    write every row could: the chain alone then verifies."""
    from events.canonical import chain_hash
    from events.rows import header_of

    rows = list(store.read_all(raw=True))
    rows[position - 1]["data"] = rows[position - 1]["data"].replace('"n":', '"n":1000')
    prev = rows[position - 2]["hash"]
    with store.engine.begin() as conn:
        for row in rows[position - 1:]:
            row["hash"] = chain_hash(prev, header_of(row), row["data"])
            conn.execute(text("UPDATE events SET data = :d, prev_hash = :p, hash = :h "
                              "WHERE position = :pos"),
                         {"d": row["data"], "p": prev, "h": row["hash"], "pos": row["position"]})
            prev = row["hash"]
        conn.execute(text("UPDATE log_head SET hash = :h"), {"h": prev})


def test_a_head_kept_outside_the_database_catches_a_rewrite_the_chain_alone_cannot(
        store: EventStore) -> None:
    seeded(store)
    kept = json.loads(run_cli("verify", "--json").output)["head"]
    assert kept == f"10:{store.head()[1]}"
    assert run_cli("verify", "--anchor", kept).exit_code == 0
    store.append([StreamAppend("s/1", 10, [event("e10", {"n": 10})])])  # the log grows on
    assert run_cli("verify", "--anchor", kept).exit_code == 0

    rewrite_from(store, 3)
    assert report(store).ok  # the chain and head agree again: only the anchor can tell
    result = verify_log(store, (10, kept.split(":")[1]))
    assert (result.ok, result.problem, result.first_bad_position) == (False, "anchor_mismatch", 10)
    cli = run_cli("verify", "--anchor", kept)
    assert cli.exit_code == 1 and "anchor_mismatch" in cli.output


def test_an_anchor_past_the_end_of_the_log_says_rows_were_removed(store: EventStore) -> None:
    seeded(store)
    result = verify_log(store, (12, "0" * 64))
    assert (result.ok, result.problem, result.first_bad_position) == (False, "anchor_mismatch", 11)


@pytest.mark.parametrize("anchor", ["10", "0:" + "a" * 64, "x:" + "a" * 64, "10:abc",
                                    "10:" + "A" * 64, "\u0661:" + "a" * 64,
                                    f"{2**63}:" + "a" * 64, ":" + "a" * 64])
def test_a_malformed_anchor_is_refused_naming_it(store: EventStore, anchor: str) -> None:
    seeded(store)
    cli = run_cli("verify", "--anchor", anchor)
    assert cli.exit_code == 2 and "anchor" in cli.stderr and "Traceback" not in cli.stderr


def test_verify_of_an_empty_log_offers_no_head_an_anchor_would_refuse(store: EventStore) -> None:
    # Before: "head 0:000…", which `--anchor` refuses (an anchor names an event).
    result = run_cli("verify")
    assert result.exit_code == 0
    assert result.output.strip() == "chain intact: 0 events verified; the log is empty: no head to anchor"
    assert json.loads(run_cli("verify", "--json").output)["head"] is None
