"""A command whose decision raises is rejected alone; its batch is decided, never held hostage.

Before, any exception in a handler rolled back the whole batch's transaction, on every retry:
one command its policy could not decide (a division that underflowed, a row missing a key)
left every other command batched with it undecided for good.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from controlplane.commands import CommandBase, command_adapter
from controlplane.decisions import DecisionContext
from controlplane.handlers import HANDLERS
from controlplane.service import accept, decide, pending_command_ids
from controlplane.workloads import inventory, model, placement
from events.model import StreamAppend
from events.store import EventStore
from tests.fleet_helpers import assert_replay_exact, decision


def accepted(store: EventStore, *payloads: dict[str, Any]) -> list[str]:
    return accept(store, [command_adapter.validate_python(p) for p in payloads])


def failing_for(replica_id: str, error: Exception) -> Any:
    """`PlaceReplica`'s handler, raising `error` for `replica_id` only."""
    original = HANDLERS["PlaceReplica"]

    def handler(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
        if getattr(command, "replica_id", None) == replica_id:
            raise error
        return original(command, ctx)
    return handler


def test_a_command_whose_handler_raises_is_rejected_and_the_rest_of_its_batch_is_decided(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    decide(store, accepted(store, *inventory(1, 4), model()))
    monkeypatch.setitem(HANDLERS, "PlaceReplica",
                        failing_for("b", ZeroDivisionError("float division by zero")))
    ids = accepted(store, placement("a", "chat"), placement("b", "chat"), placement("c", "chat"))

    outcomes = decide(store, ids)

    assert [o.decided_now for o in outcomes] == [True, True, True]
    assert decision(store, "place-a").event_type == "ReplicaPlaced"
    assert decision(store, "place-c").event_type == "ReplicaPlaced"
    failed = decision(store, "place-b")
    assert (failed.event_type, failed.stream_id, failed.data["outcome"]) == (
        "CommandRejected", "inbox", "rejected")
    assert failed.data["reasons"] == [{
        "code": "decision_failed", "facts": {"error": "ZeroDivisionError",
                                             "detail": "float division by zero"},
        "message": "the decision could not be made from this command and the fleet's state"}]
    assert failed.data["inputs"]["replica_id"] == "b"
    assert pending_command_ids(store) == []
    # Re-derivation calls the handler the same way, so it rejects the command the same way.
    assert_replay_exact(store)


def test_a_failure_outside_the_decision_still_fails_the_batch_and_writes_nothing(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    decide(store, accepted(store, *inventory(1, 4), model()))
    head = store.head()
    monkeypatch.setitem(HANDLERS, "PlaceReplica", failing_for(
        "b", OperationalError("SELECT 1", {}, Exception("server closed the connection"))))
    ids = accepted(store, placement("a", "chat"), placement("b", "chat"))
    after_accept = store.head()

    with pytest.raises(OperationalError):
        decide(store, ids)

    assert after_accept != head
    assert store.head() == after_accept
    assert pending_command_ids(store) == ids
