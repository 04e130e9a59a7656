"""A command that references what an earlier, still undecided command creates is decided after
it, whichever batch reaches the append lock first.

With several workers, a later batch can take the lock before an earlier one: a release decided
before its request's admission was rejected (`unknown_request_id`) for good, and the admission
then held its live tokens forever. Here the two batches are decided in the wrong order by hand.
"""

from __future__ import annotations

from controlplane.commands import command_adapter
from controlplane.service import accept, decide
from events.store import EventStore
from tests.fleet_helpers import assert_replay_exact, decision
from tests.integration.test_admission_commands import POOL, admit, ready_pool, release


def accepted(store: EventStore, payload: dict[str, object]) -> str:
    [command_id] = accept(store, [command_adapter.validate_python(payload)])
    return command_id


def live_tokens(store: EventStore) -> int:
    """The pool's live-token reservations after its last admission change."""
    return int(store.read_stream(f"pool/{POOL}")[-1].data["result"]["live_tokens"])


def test_a_release_decided_before_its_admission_waits_for_it_and_frees_its_tokens(
        store: EventStore) -> None:
    ready_pool(store, "r1")
    admission = accepted(store, admit("req-1", 1_000))
    freeing = accepted(store, release("req-1", second=1))
    enqueued: list[list[str]] = []
    [waiting] = decide(store, [freeing], enqueue=enqueued.append)  # its batch got the lock first
    assert (waiting.decided_now, waiting.events, waiting.waits_for) == (False, (), (admission,))
    assert store.events_for_command(freeing)[1:] == []  # no decision recorded
    assert enqueued == [[admission, freeing]]  # the creator first
    decide(store, enqueued[0])
    assert decision(store, admission).event_type == "RequestAdmitted"
    assert decision(store, freeing).data["outcome"] == "release"
    assert live_tokens(store) == 0
    assert_replay_exact(store)


def test_a_rejection_whose_reference_no_undecided_command_creates_is_recorded(
        store: EventStore) -> None:
    """Only an undecided creator is waited for: a release of a shed request is refused now."""
    ready_pool(store, "r1", max_tokens_per_request=100)
    shed = accepted(store, admit("req-2", 1_000))
    decide(store, [shed])
    assert decision(store, shed).event_type == "RequestShed"
    freeing = accepted(store, release("req-2", second=1))
    [outcome] = decide(store, [freeing])
    assert outcome.decided_now and outcome.waits_for == ()
    assert decision(store, freeing).event_type == "CommandRejected"
