"""A decision reads the versions of the streams it appends to with its batch, in one query.

A stream version read alone under the append lock is a round trip of its own on PostgreSQL
(the lock held while it waits); the first decision on a stream (a model never assessed, a pool's
first autoscaler observation, the catalog, a policy, a gateway operation) is where one slipped
through. Observed on SQLite's own statement trace: in the deciding transaction the stream
versions are read once, before the handler is called, and never while it decides.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from controlplane import deciding
from controlplane.commands import CommandBase, command_adapter
from controlplane.commands.gateway import ReconcileOperation
from controlplane.decisions import DecisionContext
from controlplane.gateway.fixture_provider import FIXTURE_DIR_ENV
from controlplane.gateway.scenario import common_fixture, dispatch
from controlplane.handlers import HANDLERS, Handler
from controlplane.runtime import open_store
from controlplane.service import accept, decide
from controlplane.workloads import assessment, at, inventory, model, observe, placement
from events.model import StreamAppend
from events.store import EventStore

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
        monkeypatch.setitem(deciding.HANDLERS, name, marked(handler))
    event.listen(store.engine, "checkout", traced)
    try:
        yield seen
    finally:
        event.remove(store.engine, "checkout", traced)


def decided_alone(store: EventStore, command: CommandBase,
                  monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str]]:
    """The deciding transaction's statements (from `BEGIN IMMEDIATE` to `COMMIT`), split where
    the handler was called: those read ahead, and those run while deciding and appending."""
    [command_id] = accept(store, [command])
    with statements(store, monkeypatch) as seen:
        [outcome] = decide(store, [command_id])
    assert outcome.decided_now and outcome.events
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


@pytest.mark.parametrize(("payload", "stream_id"), [
    (assessment("assess-1", "never-assessed"), "memory/never-assessed"),
    (observe("first-observation", "chat", 10, 2_000), "autoscaler/chat"),
    (model("mistral-7b", "mistralai/Mistral-7B-v0.3"), "catalog"),
    (memory_policy(), "policy/memory"),
], ids=lambda value: value["type"] if isinstance(value, dict) else "")
def test_a_first_decision_on_a_stream_reads_its_version_with_the_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payload: dict[str, Any],
        stream_id: str) -> None:
    """Decided by a process that has read nothing yet (a fresh work horse)."""
    store = fresh_process_store(tmp_path, [command_adapter.validate_python(p) for p in
                                           [*inventory(2, 2), model(), placement("r1", "chat")]])
    try:
        ahead, deciding_ = decided_alone(store, command_adapter.validate_python(payload),
                                         monkeypatch)
        [versions] = versions_read(ahead)
        assert f"'{stream_id}'" in versions
        assert versions_read(deciding_) == []
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
        ahead, _ = decided_alone(store, dispatch("alice", "first-key"), monkeypatch)
        [versions] = versions_read(ahead)
        assert "'operation/acme/first-key'" in versions
        assert {"gateway_operation", "gateway_tenant", "gateway_principal",
                "gateway_pointer"} <= rows_read(ahead)
    finally:
        store.engine.dispose()


def test_a_reconciliation_reads_its_operation_version_and_row_with_the_batch(
        tmp_path: Path) -> None:
    """Even one refused for want of an operation: the refusal goes to the operation's stream."""
    store = fresh_process_store(tmp_path, common_fixture())
    try:
        with pytest.MonkeyPatch.context() as monkeypatch:
            ahead, _ = decided_alone(store, ReconcileOperation(
                tenant="acme", idempotency_key="never-sent", resolution="not_processed",
                evidence_ref="ticket-1"), monkeypatch)
        [versions] = versions_read(ahead)
        assert "'operation/acme/never-sent'" in versions
        assert "gateway_operation" in rows_read(ahead)
    finally:
        store.engine.dispose()
