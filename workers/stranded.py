"""Enqueuing again, from a serving worker's heartbeat, accepted commands no job will decide.

The inbox holds every accepted command; a job in Redis only points at some of them. Some faults
leave commands no job points at while Redis itself looks well, so `workers.outage` (a Redis
that came back empty) does not see them:
- a Redis restored from a snapshot, or failed over to a replica, that has the queue's marker
  but not the jobs enqueued after it;
- a job that used up its retries (the database down longer than their back-off) and lies in
  the failed registry;
- a work horse killed (SIGKILL, the OOM killer) with no worker started after it: RQ retries
  its abandoned job only when it cleans the started-job registry, every ten minutes.

So every FLEET_SWEEP_SECONDS (15 s) one serving worker (a lock in Redis) cleans its queues' started-job
registries (an abandoned job whose execution expired is retried, `RETRY`) and, when its queues
are idle (nothing queued, started or waiting for a retry), notes the undecided commands. If at
its next look the queues are still idle and some of those are still undecided, no job is
going to decide them: they are enqueued again. (Two looks: a submitter enqueues what it
accepted within moments.) Enqueuing again is harmless: a command decided meanwhile is not
decided twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from redis import Redis
from redis.exceptions import RedisError
from rq import Queue
from rq.registry import ScheduledJobRegistry, StartedJobRegistry

from controlplane.settings import positive_int_from_env

log = structlog.get_logger(__name__)
# How often a worker looks (FLEET_SWEEP_SECONDS); the lock lets one worker look per period.
SWEEP_SECONDS = 15
SWEEP_ENV = "FLEET_SWEEP_SECONDS"
MAX_SWEEP_SECONDS = 3_600


def sweep_seconds() -> int:
    """FLEET_SWEEP_SECONDS (InputError naming it when it is not 1 to 3,600)."""
    return positive_int_from_env(SWEEP_ENV, SWEEP_SECONDS, MAX_SWEEP_SECONDS)


@dataclass(frozen=True)
class Inbox:
    """What a worker needs of the inbox to find stranded commands: the accepted commands with
    no decision (or with outside effects left undone), and a way to enqueue them; and which
    log it is (`workers.claims`)."""

    undecided: Callable[[], Sequence[str]]
    enqueue: Callable[[Redis, list[str]], object]
    # The log's identity (`EventStore.log_id`), for the worker's claim on its queues.
    log_id: Callable[[], str | None] | None = None


def sweep_lock_key(queue_name: str) -> str:
    return f"fleet:stranded-sweep:{queue_name}"


class StrandedCommandsWatch:
    """See the module's docstring. `check` never raises: a heartbeat must not stop a worker."""

    def __init__(self, connection: Redis, queues: Sequence[Queue], inbox: Inbox | None) -> None:
        self.connection, self.queues, self.inbox = connection, list(queues), inbox
        self.period = sweep_seconds()
        self.checked_at = time.monotonic()  # the first look one period after start-up
        self.seen: set[str] | None = None  # undecided at this worker's last idle look

    def check(self) -> list[str]:
        """The commands this call enqueued again (none, most of the time)."""
        clock = time.monotonic()
        if self.inbox is None or clock - self.checked_at < self.period:
            return []
        self.checked_at = clock
        try:
            if not self.connection.set(sweep_lock_key(self.queues[0].name), "sweeping", nx=True,
                                       ex=self.period):
                return []  # another worker looked within this period
            for queue in self.queues:
                StartedJobRegistry(queue=queue).cleanup()
            idle = all(self._idle(queue) for queue in self.queues)
        except RedisError as error:  # unreachable: RQ's own loop waits for it
            log.warning("stranded_sweep_failed", error=f"{type(error).__name__}: {error}")
            return []
        if not idle:
            self.seen = None
            return []
        try:
            undecided = list(dict.fromkeys(self.inbox.undecided()))
        except Exception as error:  # the database unreachable: the next look tries again
            log.warning("stranded_sweep_failed", error=f"{type(error).__name__}: {error}")
            return []
        stranded = [command_id for command_id in undecided
                    if self.seen is not None and command_id in self.seen]
        self.seen = set(undecided)
        if not stranded:
            return []
        try:
            self.inbox.enqueue(self.connection, stranded)
        except Exception as error:
            log.warning("stranded_sweep_failed", error=f"{type(error).__name__}: {error}")
            return []
        log.warning("stranded_commands_enqueued", count=len(stranded), first=stranded[0])
        self.seen = None
        return stranded

    @staticmethod
    def _idle(queue: Queue) -> bool:
        return (queue.count == 0 and StartedJobRegistry(queue=queue).count == 0
                and ScheduledJobRegistry(queue=queue).count == 0)  # type: ignore[no-untyped-call]
