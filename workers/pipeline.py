"""Submission and recovery paths: accept into the log, enqueue, and (embedded) run the work."""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

from redis import Redis
from redis.exceptions import RedisError

from controlplane.commands import CommandBase
from controlplane.errors import InputError, OperationalError
from controlplane.service import Outcome, accept, pending_command_ids, unfinished_command_ids
from controlplane.settings import Settings
from events.store import EventStore
from workers.claims import check_claim
from workers.connections import connect, probe, queue_connection, redis_url_in_use
from workers.queue import command_queue, enqueue_commands, not_in_a_job, resumes
from workers.runner import work
from workers.stranded import Inbox


@dataclass(frozen=True)
class Submitted:
    accepted_ids: list[str]
    job_ids: list[str]
    ran_in_process: bool


STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


# Said when commands are still undecided at a deadline, by where the work runs.
WORKERS_HINT = "are workers running? (`fleetctl worker`)"
EMBEDDED_HINT = "the rest stay in the inbox: `fleetctl reconcile` decides them"


def _run_embedded_if_needed(settings: Settings, connection: Redis,
                            deadline: float | None = None) -> bool:
    """With no real Redis and no `fleetctl up`, the work happens here and now (until
    `deadline`, a `time.monotonic()` instant, if given)."""
    if redis_url_in_use(settings) is not None:
        return False
    _work_in_process(connection, settings.queues, deadline)
    return True


def _resume_job_next(connection: Redis, queues: Sequence[str]) -> bool:
    """Whether the next job of the first non-empty queue resumes handed-off calls."""
    for name in queues:
        head = connection.lindex(command_queue(connection, name).key, 0)
        if head is not None:
            job_id = head.decode() if isinstance(head, bytes) else str(head)
            return resumes(job_id)
    return False


def _work_in_process(connection: Redis, queues: Sequence[str],
                     deadline: float | None = None) -> None:
    """Decide the queued jobs here; on SIGINT or SIGTERM, stop after the job in hand and raise
    KeyboardInterrupt (the undecided commands stay in the inbox). Past `deadline` it stops
    after the job in hand too (bar the jobs resuming calls handed off, at the queue's front),
    and returns: the commands not decided stay in the inbox. A job
    that failed here (RQ keeps it for a retry) raises OperationalError naming the last failure
    once the queue is worked: it is not a timeout, and `reconcile` would not report it.

    The stop signals are blocked while the worker runs and looked for between jobs: RQ's worker
    installs handlers that call Redis, and one that interrupts a call into the in-process fake
    Redis waits forever for the lock that call holds. Its handlers are removed afterwards.
    """
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    # Not a signal the caller blocks (it stays pending for the caller) or ignores (`nohup`).
    ours = {signum for signum in STOP_SIGNALS
            if signum not in previous_mask and handlers[signum] is not signal.SIG_IGN}
    stopped = False
    failures: list[str] = []

    def stop_when() -> bool:
        if ours & signal.sigpending():
            return True
        # Past the deadline, calls decided commands reserved and a job handed off are still
        # made (their jobs wait at the front of the queue): left in this process's fake Redis,
        # they would be lost with it, and their reservations' leases run.
        return deadline is not None and time.monotonic() >= deadline \
            and not _resume_job_next(connection, queues)

    try:
        work(connection, queues, burst=True, forking=False, stop_when=stop_when,
             failures=failures)
    finally:
        while ours and signal.sigtimedwait(ours, 0) is not None:
            stopped = True
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
    if stopped:
        raise KeyboardInterrupt
    if failures:  # the work ran here: a job that failed is the caller's failure, not a timeout
        raise OperationalError(
            f"{len(failures)} decide job(s) failed here ({failures[-1]}); their commands stay "
            "in the inbox: `fleetctl reconcile` tries them again")


def submit(settings: Settings, store: EventStore, commands: Sequence[CommandBase],
           lines: Sequence[int] | None = None, deadline: float | None = None) -> Submitted:
    """Record `commands` in the inbox, then enqueue those still undecided in batches.

    A malformed Redis URL, or one the server refuses (a database it does not have), is
    refused before anything is written. An unreachable Redis is not: the inbox is written
    first, then OperationalError; `reconcile` finds the commands later, and submitting them
    again enqueues them again. On the embedded queue the work runs here, until `deadline`.
    """
    connection = queue_connection(settings)
    unreachable = probe(connection)
    claimed = unreachable is None and redis_url_in_use(settings) is not None
    log_id = store.log_id() if claimed else None
    if claimed:
        check_claim(connection, settings.command_queue, log_id)  # before any write
    accepted = accept(store, commands, lines)
    undecided = _with_undecided_resubmissions(store, commands, accepted)
    if unreachable is not None:
        raise _recorded_undecided(str(unreachable), len(undecided))
    if claimed and log_id is None:  # the log's first events: it has a name only now
        try:
            check_claim(connection, settings.command_queue, store.log_id())
        except InputError as error:  # written, so not "bad input, nothing written" (exit 2)
            raise OperationalError(
                f"{error}; {len(undecided)} command(s) are recorded in the inbox, undecided: "
                "`fleetctl reconcile` with a queue of this database's own enqueues them") from None
    try:
        job_ids = enqueue_commands(connection, settings, undecided)
    except RedisError as error:  # it answered the probe, then refused (out of memory, say)
        raise _recorded_undecided(f"Redis failure: {type(error).__name__}: {error}",
                                  len(undecided)) from None
    ran = _run_embedded_if_needed(settings, connection, deadline)
    return Submitted(accepted, job_ids, ran)


def _recorded_undecided(problem: str, count: int) -> OperationalError:
    """The error for commands recorded in the inbox that could not be enqueued."""
    return OperationalError(
        f"{problem}; {count} command(s) are recorded in the inbox, undecided: once Redis "
        "answers, `fleetctl reconcile` (or submitting again) enqueues them")


def _with_undecided_resubmissions(store: EventStore, commands: Sequence[CommandBase],
                                  accepted: list[str]) -> list[str]:
    """`accepted`, then the submitted commands accepted before that still have no decision."""
    submitted = list(dict.fromkeys(c.command_id for c in commands))
    if len(submitted) == len(accepted):
        return accepted
    pending = set(pending_command_ids(store))
    fresh = set(accepted)
    return [*accepted, *(c for c in submitted if c in pending and c not in fresh)]


def undecided_ids(store: EventStore) -> list[str]:
    """Every accepted command that has no decision, then every decided one whose resumable
    effects are undone (a worker died after deciding it): what a reconcile enqueues."""
    return list(dict.fromkeys([*pending_command_ids(store), *unfinished_command_ids(store)]))


def inbox_for(settings: Settings, store: EventStore) -> Inbox:
    """The inbox as a serving worker sweeps it for stranded commands (`workers.stranded`)."""
    return Inbox(lambda: undecided_ids(store),
                 lambda connection, ids: enqueue_commands(connection, settings, ids),
                 store.log_id)


def reconcile(settings: Settings, store: EventStore, deadline: float | None = None) -> Submitted:
    """Re-enqueue every accepted command that has no decision (after Redis lost its queue), and
    every decided one whose resumable effects are undone (a worker died after deciding it),
    but those whose job is still queued or running. On the embedded queue the work runs here,
    until `deadline` if given."""
    connection = connect(settings)
    if redis_url_in_use(settings) is not None:
        check_claim(connection, settings.command_queue, store.log_id())
    # A batch whose job is still queued or running is left to it (a worker's start, with a
    # backlog queued, had enqueued all of it once more).
    pending = not_in_a_job(connection, settings, undecided_ids(store))
    job_ids = enqueue_commands(connection, settings, pending)
    ran = _run_embedded_if_needed(settings, connection, deadline)
    return Submitted(pending, job_ids, ran)


def wait_for_decisions(store: EventStore, command_ids: Sequence[str], timeout_seconds: float,
                       hint: str = WORKERS_HINT, poll: bool = True) -> list[Outcome]:
    """Poll the log until every command is decided; OperationalError on timeout, ending with
    `hint`. With `poll` false the time is already up (the work ran here and stopped): look
    once."""
    deadline = time.monotonic() + timeout_seconds
    delay = 0.05
    while True:
        pending = set(pending_command_ids(store))
        remaining = [c for c in command_ids if c in pending]
        if not remaining:
            break
        if not poll or time.monotonic() > deadline:
            raise OperationalError(
                f"{len(remaining)} command(s) undecided after {timeout_seconds:g}s; {hint}")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
    by_command = store.events_for_commands(command_ids)
    return [Outcome(c, False, tuple(e for e in by_command.get(c, [])
                                    if e.event_type != "CommandAccepted"))
            for c in command_ids]
