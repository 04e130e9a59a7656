"""The process's projection cache and GPU index, through the log on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from controlplane.commands import command_adapter
from controlplane.faults.invariants import gpu_holds
from controlplane.handlers.placement import inventory
from controlplane.policies.placement import Locality, PlacementRequest, place_replica
from controlplane.policies.reasons import to_plain
from controlplane.replay import compare_with_live
from controlplane.replay.rebuild import rebuild_live
from controlplane.runtime import open_store, store_for_process
from controlplane.service import accept, decide
from controlplane.state.fleet import NODE, PLACEMENT_REFUSED, REPLICA, REPLICA_PLACED
from controlplane.state.fold import apply_event
from controlplane.state.gpu_index import GPU_ID_SEPARATOR, GpuIndex, gpu_index
from events.projections import MemoryProjections, SqlProjections, drop_all, load_all
from events.store import EventStore
from events.tables import HEAD
from events.transaction import LogTransaction
from tests.factories import append_marker, register_model, register_node
from tests.factories import place_replica as place
from tests.fleet_helpers import assert_replay_exact, run

pytestmark = pytest.mark.usefixtures("embedded_queue")
ROOT = Path(__file__).resolve().parents[2]


def test_a_cache_never_serves_state_from_before_another_process_append(store: EventStore) -> None:
    deciding = store_for_process()  # accepts and decides here: only the other process moves the log
    run(deciding, register_node("n1", gpus=2), register_node("n2", gpus=2), register_model(),
        place("r1"))  # this process now holds the fleet's rows and GPU index
    other = ("from tests.fleet_helpers import run; from tests.factories import place_replica;"
             "from controlplane.runtime import store_for_process;"
             "run(store_for_process(), place_replica('r2'))")
    subprocess.run([sys.executable, "-c", other], cwd=ROOT, check=True, timeout=120)
    run(deciding, place("r3"))
    held = gpu_holds(store.read_all())
    assert sum(held.values()) == 3 and set(held.values()) == {1}
    assert_replay_exact(store)


def test_a_transaction_that_fails_after_writing_leaves_nothing_behind_in_the_cache(
        store: EventStore, database_url: str) -> None:
    # The store the in-process worker decides on: its cache is the one that must stay clean.
    deciding = store_for_process()
    run(deciding, register_node("n1", gpus=3), register_model(), place("r1"))
    decide_elsewhere(database_url, place("r0"))
    with deciding.transaction() as tx:  # brings the cached index (and its row texts) up to date
        gpu_index(tx.projections, 0.9)
    with pytest.raises(RuntimeError), deciding.transaction() as tx:
        node = tx.projections.get(NODE, "n1")
        assert node is not None
        taken = {gpu_id: {**gpu, "reserved_by": "ghost"} for gpu_id, gpu in node["gpus"].items()}
        tx.projections.put(NODE, "n1", {**node, "gpus": taken})
        raise RuntimeError("the transaction fails after writing")
    run(deciding, place("r2"))
    assert sum(gpu_holds(store.read_all()).values()) == 3
    assert_replay_exact(store)


def test_after_the_projections_are_dropped_no_row_from_before_is_read(store: EventStore) -> None:
    with store.transaction() as tx:
        append_marker(tx)
        tx.projections.put("scratch", "k", {"value": 1})
    with store.transaction() as tx:
        assert tx.projections.get("scratch", "k") == {"value": 1}  # cached by now
        drop_all(tx.connection)
        assert tx.projections.get("scratch", "k") is None
        assert list(tx.projections.items("scratch")) == []


def test_rebuilding_the_live_projections_keeps_placement_exact(store: EventStore) -> None:
    run(store, register_node("n1", gpus=4), register_node("n2", gpus=4), register_model(),
        place("r1", tp=2), place("r2"))
    rebuild_live(store)
    run(store, place("r3", tp=2), place("r4"))
    assert set(gpu_holds(store.read_all()).values()) == {1}
    assert compare_with_live(store) == []


def test_a_rebuild_by_another_process_is_never_hidden_by_rows_cached_here(
        store: EventStore, database_url: str) -> None:
    run(store, register_node("n1", gpus=2), register_model(), place("r1"))
    with store.engine.begin() as conn:  # a damaged projection row, as a rebuild would repair
        conn.execute(text("UPDATE projections SET data = :d WHERE name = 'replica' AND key = 'r1'"),
                     {"d": '{"damaged": true}'})
    with store.transaction() as tx:  # read here, and cached for this head
        assert tx.projections.get(REPLICA, "r1") == {"damaged": True}
    other = open_store(database_url)
    rebuild_live(other)
    other.engine.dispose()
    with store.transaction() as tx:
        assert tx.projections.get(REPLICA, "r1") != {"damaged": True}
    assert compare_with_live(store) == []


def scanned(state: MemoryProjections, decision: dict[str, Any]) -> list[Any]:
    """The placement reasons `place_replica` gives when it scans every GPU of `state`."""
    command, result = decision["inputs"]["command"], decision["result"]
    request = PlacementRequest(
        command["replica_id"], command["model_id"], result["tensor_parallel"],
        result["memory"]["required_gib_per_gpu"], frozenset(command["required_capabilities"]),
        Locality(command["locality"]))
    fleet = inventory(state, decision["policy"]["parameters"]["usable_fraction"])
    return to_plain(list(place_replica(request, fleet).reasons))  # type: ignore[no-any-return]


def test_every_recorded_placement_equals_a_scan_of_every_gpu_in_the_state_before_it(
        store: EventStore) -> None:
    nodes = [register_node(f"n{i}", gpus=4, memory_gib=80.0 if i % 2 else 40.0, rack=f"rack-{i // 2}",
                           capabilities=("bf16", "fp8") if i < 3 else ("bf16",)) for i in range(6)]
    run(store, *nodes, register_model())
    run(store, *[place(f"a{i}", tp=tp, required_capabilities=caps, locality=locality)
                 for i, (tp, caps, locality) in enumerate(
                     [(1, [], "node"), (2, [], "node"), (4, ["fp8"], "node"), (1, ["fp8"], "rack"),
                      (2, [], "link_domain"), (8, [], "node"), (8, [], "any"), (1, [], "node")])])
    run(store, {"type": "ReleaseReplica", "replica_id": "a1", "command_id": "release-a1"},
        {"type": "ReleaseReplica", "replica_id": "a0", "command_id": "release-a0"},
        {"type": "CordonNode", "node_id": "n5", "command_id": "cordon-n5"})
    run(store, *[place(f"b{i}", tp=tp) for i, tp in enumerate([1, 2, 2, 4, 4, 4, 1])])
    state, checked = MemoryProjections(), Counter[str]()
    for event in store.read_all():
        if event.event_type in (REPLICA_PLACED, PLACEMENT_REFUSED):
            placement_reasons = scanned(state, event.data)
            assert event.data["reasons"][-len(placement_reasons):] == placement_reasons
            checked[event.event_type] += 1
        apply_event(state, event)
    assert checked[REPLICA_PLACED] >= 10 and checked[PLACEMENT_REFUSED] >= 1
    assert_replay_exact(store)


def test_a_replica_kv_capacity_is_that_of_the_gpus_it_got_not_of_the_largest(store: EventStore) -> None:
    run(store, register_node("small", gpus=1, memory_gib=40.0), register_node("big", gpus=1),
        register_model(), place("r1"), place("r2"))
    placed = {e.data["result"]["replica_id"]: e.data["result"] for e in store.read_all()
              if e.event_type == REPLICA_PLACED}
    assert (placed["r1"]["gpus"], placed["r2"]["gpus"]) == ({"small": ["g0"]}, {"big": ["g0"]})
    assert 0 < placed["r1"]["kv_capacity_tokens"] < placed["r2"]["kv_capacity_tokens"]
    assert_replay_exact(store)


@contextmanager
def read_only(store: EventStore) -> Iterator[LogTransaction]:
    """A transaction without the append lock, rolled back at the end; its projections keep a
    cache of their own."""
    with store.engine.connect() as conn, conn.begin() as transaction:
        position, head_hash = conn.execute(HEAD).one()
        yield LogTransaction(conn, position, head_hash, holds_lock=False)
        transaction.rollback()


def test_a_read_only_transaction_builds_a_view_once_and_keeps_it_current_with_its_writes(
        store: EventStore) -> None:
    run(store, register_node("n1", gpus=2), register_model())
    with read_only(store) as snapshot:
        index = gpu_index(snapshot.projections, 0.9)
        assert gpu_index(snapshot.projections, 0.9) is index
        node = snapshot.projections.get(NODE, "n1")
        assert node is not None and len(index.signatures()) == 1
        taken = {gpu_id: {**gpu, "reserved_by": "r1"} for gpu_id, gpu in node["gpus"].items()}
        snapshot.projections.put(NODE, "n1", {**node, "gpus": taken})
        assert len(index.signatures()) == 0 and index.gpu_count == 2
    with read_only(store) as snapshot:  # nothing of the rolled-back transaction remains
        assert len(gpu_index(snapshot.projections, 0.9).signatures()) == 1


def fresh_index(tx: LogTransaction) -> GpuIndex:
    """A GPU index built from the node rows as stored, ignoring every cache."""
    index = GpuIndex(0.9)
    for node_id, row in load_all(tx.connection).get(NODE, {}).items():
        index.apply(node_id, row)
    return index


def same_index(kept: GpuIndex, fresh: GpuIndex) -> bool:
    return (list(kept.inventory()) == list(fresh.inventory())
            and kept.signatures() == fresh.signatures())


def decide_elsewhere(url: str, *payloads: dict[str, Any]) -> None:
    """Accept and decide on an engine of its own, as another process would."""
    other = open_store(url)
    decide(other, accept(other, [command_adapter.validate_python(p) for p in payloads]))
    other.engine.dispose()


def test_views_kept_across_other_appends_equal_views_built_from_the_stored_rows(
        store: EventStore, database_url: str) -> None:
    deciding = store_for_process()
    run(deciding, register_node("n1", gpus=2), register_node("n2", gpus=2), register_model(),
        place("r1"))
    decide_elsewhere(database_url, place("r2"), register_node("n3", gpus=1))
    with deciding.transaction() as tx:  # the head moved: the cached index is brought up to date
        assert same_index(gpu_index(tx.projections, 0.9), fresh_index(tx))
    decide_elsewhere(database_url, place("r3"))
    with read_only(deciding) as snapshot:  # builds its own index, from the stored rows
        seeded = gpu_index(snapshot.projections, 0.9)
        assert same_index(seeded, fresh_index(snapshot))
        node = snapshot.projections.get(NODE, "n2")  # a node r3 did not change
        assert node is not None
        snapshot.projections.put(NODE, "n2", {**node, "cordoned": True})
        assert not same_index(seeded, fresh_index(snapshot))
    with deciding.transaction() as tx:  # the read-only transaction's write stayed in it
        assert same_index(gpu_index(tx.projections, 0.9), fresh_index(tx))
    run(deciding, place("r4"))
    holds = gpu_holds(deciding.read_all())
    assert set(holds.values()) == {1} and sum(holds.values()) == 4
    assert_replay_exact(deciding)


def test_a_view_whose_first_build_fails_leaves_the_cache_usable(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    run(store, register_node("n1", gpus=2), register_node("n2", gpus=2))
    fresh = open_store(store.engine.url.render_as_string(hide_password=False))  # nothing cached
    stored = SqlProjections.stored_rows
    calls = Counter[str]()

    def fails_once(self: SqlProjections, name: str) -> dict[str, str]:
        calls[name] += 1
        if calls[name] == 1:
            raise RuntimeError("the read of every row failed")
        return stored(self, name)

    monkeypatch.setattr(SqlProjections, "stored_rows", fails_once)
    try:
        with pytest.raises(RuntimeError, match="every row"), fresh.transaction() as tx:
            gpu_index(tx.projections, 0.9)
        with fresh.transaction() as tx:  # the next transaction builds it, and it is whole
            index = gpu_index(tx.projections, 0.9)
            rebuilt = MemoryProjections()
            for key, value in tx.projections.items(NODE):
                rebuilt.put(NODE, key, value)
            fresh_index = gpu_index(rebuilt, 0.9)
            for node in ("n1", "n2"):
                prefix = node + GPU_ID_SEPARATOR
                assert index.available_on(prefix) == fresh_index.available_on(prefix)
                assert len(index.available_on(prefix)) == 2
    finally:
        fresh.engine.dispose()


def test_another_reader_on_a_writers_connection_never_rewinds_the_writers_rows(
        store: EventStore) -> None:
    with store.transaction() as tx:
        append_marker(tx)
        tx.projections.put("things", "k", {"v": 1})
    with store.transaction() as tx:
        append_marker(tx)
        tx.projections.put("things", "k", {"v": 2})
        assert SqlProjections(tx.connection).get("things", "k") == {"v": 1}  # what is stored
        assert tx.projections.get("things", "k") == {"v": 2}  # the transaction's own write
    with store.transaction() as tx:
        assert tx.projections.get("things", "k") == {"v": 2}


def test_projection_rows_changed_without_an_event_are_refused_and_nothing_is_written(
        store: EventStore) -> None:
    # Other processes trust their cached rows while the log head stays where it was; a change
    # of rows that does not move it would never reach them.
    with pytest.raises(ValueError, match="without an event"), store.transaction() as tx:
        tx.projections.put("things", "k", {"v": 1})
    with store.engine.connect() as conn:
        assert load_all(conn) == {}
    with store.transaction() as tx:
        assert tx.projections.get("things", "k") is None
        tx.projections.put("things", "k", {"v": 1})
        append_marker(tx)
    with store.engine.connect() as conn:
        assert load_all(conn) == {"things": {"k": {"v": 1}}}


class _Rows:
    """A table view that keeps a copy of every row: what the cache told it, and nothing else."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def apply(self, key: str, value: dict[str, Any] | None) -> None:
        if value is None:
            self.rows.pop(key, None)
        else:
            self.rows[key] = dict(value)


def test_a_view_whose_build_fails_leaves_no_stale_rows_behind(store: EventStore) -> None:
    url = store.engine.url.render_as_string(hide_password=False)
    here, other = open_store(url), open_store(url)  # two processes' caches

    def put(value: int) -> None:
        with other.transaction() as tx:
            tx.projections.put("things", "k", {"v": value})
            append_marker(tx)

    def failing() -> _Rows:
        raise RuntimeError("the view could not be built")

    try:
        put(1)
        with pytest.raises(RuntimeError, match="could not be built"), here.transaction() as tx:
            tx.projections.view("things", "rows", failing)
        put(2)
        with here.transaction() as tx:
            assert tx.projections.view("things", "rows", _Rows).rows == {"k": {"v": 2}}
        put(1)  # back to the text the failed build had read
        with here.transaction() as tx:
            assert tx.projections.get("things", "k") == {"v": 1}
            assert tx.projections.view("things", "rows", _Rows).rows == {"k": {"v": 1}}
    finally:
        here.engine.dispose()
        other.engine.dispose()


def test_a_write_to_a_projection_another_process_moved_is_not_lost_when_it_is_next_read(
        store: EventStore, database_url: str) -> None:
    """The first touch of a stale projection in a transaction is a write: the cache brings the
    projection up to date before taking it, so the next read (here, the GPU index) neither
    misses the other process's change nor reloads the stored row over this write."""
    deciding = store_for_process()
    run(deciding, register_node("n1", gpus=2), register_node("n2", gpus=2), register_model(),
        place("r1"))  # this process holds the fleet's rows and GPU index
    with deciding.transaction() as tx:
        gpu_index(tx.projections, 0.9)
    decide_elsewhere(database_url, place("r0"))  # another process moves the fleet
    with store.engine.connect() as conn:
        nodes = {node_id: SqlProjections(conn).get(NODE, node_id) for node_id in ("n1", "n2")}
    node_id, gpu_id, row = next((node_id, gpu_id, row) for node_id, row in nodes.items()
                                if row is not None for gpu_id, gpu in row["gpus"].items()
                                if gpu.get("reserved_by") is None)
    mine = {**row, "gpus": {**row["gpus"], gpu_id: {**row["gpus"][gpu_id], "reserved_by": "mine"}}}
    with pytest.raises(RuntimeError), deciding.transaction() as tx:
        tx.projections.put(NODE, node_id, mine)  # the transaction's first touch of the nodes
        held = {gpu.identifier for gpu in gpu_index(tx.projections, 0.9).inventory()
                if gpu.reserved}
        raise RuntimeError("rolled back: the write was only to be read")
    assert held == {f"{node}{GPU_ID_SEPARATOR}{gpu}" for node, gpu in
                    gpu_holds(store.read_all())} | {f"{node_id}{GPU_ID_SEPARATOR}{gpu_id}"}


def test_a_row_deleted_twice_then_put_and_deleted_again_in_one_transaction_stays_deleted(
        store: EventStore) -> None:
    """A repeated delete in one transaction is skipped (a decision's every event settles its
    command); a put after it, and a delete after that put, still count."""
    with store.transaction() as tx:
        tx.projections.put("things", "k", {"v": 1})
        tx.projections.put("things", "j", {"v": 1})
        append_marker(tx)
    with store.transaction() as tx:
        rows = tx.projections.view("things", "rows", _Rows)
        tx.projections.delete("things", "k")
        tx.projections.delete("things", "k")
        assert tx.projections.get("things", "k") is None and "k" not in rows.rows
        tx.projections.put("things", "k", {"v": 2})
        assert rows.rows["k"] == {"v": 2}
        tx.projections.delete("things", "k")
        assert tx.projections.get("things", "k") is None and "k" not in rows.rows
        append_marker(tx)
    with store.engine.connect() as conn:
        assert load_all(conn) == {"things": {"j": {"v": 1}}}
    with store.transaction() as tx:
        assert tx.projections.get("things", "k") is None
        assert tx.projections.view("things", "rows", _Rows).rows == {"j": {"v": 1}}
