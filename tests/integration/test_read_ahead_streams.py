"""A decision reads the versions of the streams it appends to with its batch, in one query.

A stream version read alone under the append lock is a round trip of its own on PostgreSQL
(the lock held while it waits); the first decision on a stream (a model never assessed, a pool's
first autoscaler observation, the catalog, a policy, a gateway operation) is where one slipped
through. Observed on SQLite's own statement trace: in the deciding transaction the stream
versions are read once, before the handler is called, and never while it decides.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from controlplane.commands import CommandBase, command_adapter
from controlplane.commands.gateway import ReconcileOperation
from controlplane.decisions import DecisionContext
from controlplane.gateway.fixture_provider import FIXTURE_DIR_ENV
from controlplane.gateway.scenario import common_fixture, dispatch
from controlplane.handlers import HANDLERS, Handler
from controlplane.runtime import open_store
from controlplane.service import accept, decide, pending_command_ids
from controlplane.workloads import (
    assessment,
    at,
    inventory,
    measurement,
    model,
    observe,
    placement,
    rollout,
)
from events.model import StreamAppend
from events.store import EventStore

SCENARIOS = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"
HEAD_QUERY = "SELECT position, hash FROM log_head WHERE id = 1"
VERSIONS_QUERY = "SELECT stream_id, max(stream_version) FROM events"
ROWS_QUERY = "SELECT key, data FROM projections WHERE name = '"


def memory_policy() -> dict[str, Any]:
    return {"type": "SetPolicy", "command_id": "policy-memory", "at": at(5), "name": "memory",
            "parameters": {"usable_fraction": 0.85}}


HANDLER_STARTS = "-- the handler starts"


@contextmanager
def statements(store: EventStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement SQLite runs on a connection `store`'s pool hands out in the block, and
    `HANDLER_STARTS` where a handler is called."""
    seen: list[str] = []

    def traced(dbapi_connection: Any, *_: Any) -> None:
        dbapi_connection.set_trace_callback(seen.append)

    def marked(handler: Handler) -> Handler:
        def called(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
            seen.append(HANDLER_STARTS)
            return handler(command, ctx)
        return called

    for name, handler in HANDLERS.items():
        monkeypatch.setitem(HANDLERS, name, marked(handler))
    event.listen(store.engine, "checkout", traced)
    try:
        yield seen
    finally:
        event.remove(store.engine, "checkout", traced)


def accepted_elsewhere(store: EventStore, command: CommandBase) -> str:
    """`command` accepted into `store`'s log by another process (as `fleetctl submit` would
    be), so `store` knows nothing of the inbox's new version; its id."""
    submitter = open_store(store.engine.url.render_as_string(hide_password=False))
    try:
        [command_id] = accept(submitter, [command])
    finally:
        submitter.engine.dispose()
    return command_id


def decided_alone(store: EventStore, command: CommandBase,
                  monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str]]:
    """`command`, accepted by another process, decided by `store` alone: the deciding
    transaction's statements, split where the handler was called (see `split_at_handler`)."""
    command_id = accepted_elsewhere(store, command)
    with statements(store, monkeypatch) as seen:
        [outcome] = decide(store, [command_id])
    assert outcome.decided_now and outcome.events
    return split_at_handler(seen)


def split_at_handler(seen: list[str]) -> tuple[list[str], list[str]]:
    """The deciding transaction's statements (from `BEGIN IMMEDIATE` to `COMMIT`), split where
    the handler was called: those read ahead, and those run while deciding and appending."""
    begin = seen.index("BEGIN IMMEDIATE")
    handler = seen.index(HANDLER_STARTS, begin)
    return seen[begin:handler], seen[handler + 1:seen.index("COMMIT", handler)]


def fresh_process_store(tmp_path: Path, setup: list[CommandBase]) -> EventStore:
    """A store that has read nothing yet (a fresh work horse's), on a log where `setup` was
    decided by another."""
    url = f"sqlite:///{tmp_path}/fleet.db"
    other = open_store(url)
    decide(other, accept(other, setup))
    other.engine.dispose()
    return open_store(url)


def versions_read(statements: list[str]) -> list[str]:
    return [s for s in statements if s.startswith(VERSIONS_QUERY)]


def rows_read(statements: list[str]) -> set[str]:
    """The projections whose rows `statements` read by key."""
    return {s[len(ROWS_QUERY):].split("'")[0] for s in statements
            if s.startswith(ROWS_QUERY) and " AND key IN (" in s}


def assert_streams_read_ahead(ahead: list[str], deciding_: list[str],
                              stream_ids: list[str]) -> None:
    [versions] = versions_read(ahead)
    for stream_id in stream_ids:
        assert f"'{stream_id}'" in versions, stream_id
    assert versions_read(deciding_) == []


@pytest.mark.parametrize(("payload", "stream_ids"), [
    (assessment("assess-1", "never-assessed"), ["memory/never-assessed"]),
    (observe("first-observation", "chat", 10, 2_000), ["autoscaler/chat", "inbox"]),
    (model("mistral-7b", "mistralai/Mistral-7B-v0.3"), ["catalog"]),
    (memory_policy(), ["policy/memory"]),
    (measurement("m1", "ro-1", "canary", 20), ["rollout/ro-1", "inbox"]),
    ({"type": "PlanFleet", "command_id": "plan-1", "plan_id": "plan-1",
      "scenario": json.loads((SCENARIOS / "default.json").read_text("utf-8"))},
     ["plan/plan-1", "inbox"]),
], ids=lambda value: value["type"] if isinstance(value, dict) else "")
def test_a_first_decision_on_a_stream_reads_its_version_with_the_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payload: dict[str, Any],
        stream_ids: list[str]) -> None:
    """Decided by a process that has read nothing yet (a fresh work horse); the scale-up, the
    measurement and the plan each issue a command to the inbox."""
    store = fresh_process_store(tmp_path, [command_adapter.validate_python(p) for p in
                                           [*inventory(2, 2), model(), placement("r1", "chat"),
                                            rollout("ro-1", "chat", 10)]])
    try:
        ahead, deciding_ = decided_alone(store, command_adapter.validate_python(payload),
                                         monkeypatch)
        assert_streams_read_ahead(ahead, deciding_, stream_ids)
    finally:
        store.engine.dispose()


def test_a_plan_stage_reads_its_plan_and_the_inbox_version_with_the_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage is issued by its plan (never submitted): decided by a fresh process."""
    plan = command_adapter.validate_python({
        "type": "PlanFleet", "command_id": "plan-1", "plan_id": "plan-1",
        "scenario": json.loads((SCENARIOS / "default.json").read_text("utf-8"))})
    store = fresh_process_store(tmp_path, [plan])
    try:
        [stage] = pending_command_ids(store)
        with statements(store, monkeypatch) as seen:
            [outcome] = decide(store, [stage])
        assert outcome.decided_now
        ahead, deciding_ = split_at_handler(seen)
        assert_streams_read_ahead(ahead, deciding_, ["plan/plan-1", "inbox"])
    finally:
        store.engine.dispose()


def test_a_dispatch_reads_its_operation_version_and_named_rows_with_the_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway request on a new idempotency key, decided by a process that has read nothing
    yet: its operation's stream version, and the operation, tenant, principal and release
    pointer rows, are read ahead (on PostgreSQL, in the lock's round trip). Its budget's
    stream and row are named by the tenant's row, so they are read while deciding."""
    monkeypatch.setenv(FIXTURE_DIR_ENV, str(tmp_path / "provider"))
    store = fresh_process_store(tmp_path, common_fixture())
    try:
        ahead, deciding_ = decided_alone(store, dispatch("alice", "first-key"), monkeypatch)
        [versions] = versions_read(ahead)
        assert "'operation/acme/first-key'" in versions
        named = {"gateway_operation", "gateway_tenant", "gateway_principal", "gateway_pointer"}
        assert named <= rows_read(ahead)
        assert named.isdisjoint(rows_read(deciding_))
    finally:
        store.engine.dispose()


def test_a_reconciliation_reads_its_operation_version_and_row_with_the_batch(
        tmp_path: Path) -> None:
    """Even one refused for want of an operation: the refusal goes to the operation's stream."""
    store = fresh_process_store(tmp_path, common_fixture())
    try:
        with pytest.MonkeyPatch.context() as monkeypatch:
            ahead, deciding_ = decided_alone(store, ReconcileOperation(
                tenant="acme", idempotency_key="never-sent", resolution="not_processed",
                evidence_ref="ticket-1"), monkeypatch)
        assert_streams_read_ahead(ahead, deciding_, ["operation/acme/never-sent"])
        assert "gateway_operation" in rows_read(ahead)
        assert rows_read(deciding_) == set()
    finally:
        store.engine.dispose()


def test_a_fresh_process_builds_its_gpu_index_before_taking_the_append_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node row read and decoded for the index while other workers may still append,
    not while they wait for the lock: under it, nothing having moved, no node row is read."""
    store = fresh_process_store(tmp_path, [command_adapter.validate_python(p) for p in
                                           [*inventory(2, 2), model()]])
    try:
        command_id = accepted_elsewhere(
            store, command_adapter.validate_python(placement("r1", "chat")))
        with statements(store, monkeypatch) as seen:
            [outcome] = decide(store, [command_id])
        assert outcome.events[0].event_type == "ReplicaPlaced"
        begin = seen.index("BEGIN IMMEDIATE")
        node_table = seen.index(f"{ROWS_QUERY}node'")
        assert seen.index(HEAD_QUERY) < node_table < begin  # the head first, then the rows
        assert not any(s.startswith(ROWS_QUERY + "node'") for s in seen[begin:])
    finally:
        store.engine.dispose()
