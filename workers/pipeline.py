"""Submission and recovery paths: accept into the log, enqueue, and (embedded) run the work."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from redis import Redis

from controlplane.commands import CommandBase
from controlplane.errors import OperationalError
from controlplane.service import Outcome, accept, pending_command_ids, unfinished_command_ids
from controlplane.settings import Settings
from events.store import EventStore
from workers.connections import connect, redis_url_in_use
from workers.queue import enqueue_commands
from workers.runner import work


@dataclass(frozen=True)
class Submitted:
    accepted_ids: list[str]
    job_ids: list[str]
    ran_in_process: bool


def _run_embedded_if_needed(settings: Settings, connection: Redis) -> bool:
    """With no real Redis and no `fleetctl up`, the work happens here and now."""
    if redis_url_in_use(settings) is not None:
        return False
    work(connection, settings.queues, burst=True, forking=False)
    return True


def submit(settings: Settings, store: EventStore, commands: Sequence[CommandBase],
           lines: Sequence[int] | None = None) -> Submitted:
    """Record `commands` in the inbox, then enqueue the newly accepted ones in batches.

    The inbox is written first: if enqueueing fails, `reconcile` finds the commands later.
    """
    accepted = accept(store, commands, lines)
    connection = connect(settings)
    job_ids = enqueue_commands(connection, settings, accepted)
    ran = _run_embedded_if_needed(settings, connection)
    return Submitted(accepted, job_ids, ran)


def reconcile(settings: Settings, store: EventStore) -> Submitted:
    """Re-enqueue every accepted command that has no decision (after Redis lost its queue), and
    every decided one whose resumable effects are undone (a worker died after deciding it)."""
    pending = list(dict.fromkeys([*pending_command_ids(store), *unfinished_command_ids(store)]))
    connection = connect(settings)
    job_ids = enqueue_commands(connection, settings, pending)
    ran = _run_embedded_if_needed(settings, connection)
    return Submitted(pending, job_ids, ran)


def wait_for_decisions(store: EventStore, command_ids: Sequence[str],
                       timeout_seconds: float) -> list[Outcome]:
    """Poll the log until every command is decided; OperationalError on timeout."""
    deadline = time.monotonic() + timeout_seconds
    delay = 0.05
    while True:
        pending = set(pending_command_ids(store))
        remaining = [c for c in command_ids if c in pending]
        if not remaining:
            break
        if time.monotonic() > deadline:
            raise OperationalError(
                f"{len(remaining)} command(s) undecided after {timeout_seconds:g}s; "
                "are workers running? (`fleetctl worker`)")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
    by_command = store.events_for_commands(command_ids)
    return [Outcome(c, False, tuple(e for e in by_command.get(c, [])
                                    if e.event_type != "CommandAccepted"))
            for c in command_ids]
