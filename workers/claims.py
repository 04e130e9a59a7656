"""Which log a queue's jobs belong to, so that two fleets sharing a Redis never share a queue.

A job names command ids, not its database. Workers of another database on the same queue (the
default name, `fleet-commands`, on a shared Redis) took the jobs of this one and skipped every
command as unknown; its commands waited in the inbox. So every serving or draining worker
claims its queues for its log (the hash of the log's first event, which no other log has:
`EventStore.log_id`) for CLAIM_SECONDS, renewed from its heartbeat; a worker, `submit` or
`reconcile` of another log is refused (exit 2, naming FLEET_QUEUE) while the claim lasts,
before it writes or enqueues anything. A log with no events yet claims nothing and cannot be
checked before its first submit writes: those commands are recorded, not enqueued there, and
the refusal exits 3 (recorded, waiting for `reconcile`, as when Redis is unreachable).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import structlog
from redis import Redis

from controlplane.errors import InputError

log = structlog.get_logger(__name__)
CLAIM_SECONDS = 120
# A serving worker renews its claim this often (from its heartbeat).
RENEW_SECONDS = 30.0


def claim_key(queue_name: str) -> str:
    return f"fleet:queue-log:{queue_name}"


def check_claim(connection: Redis, queue_name: str, log_id: str | None) -> None:
    """InputError when the queue is claimed for another log than `log_id`."""
    if log_id is None:
        return
    claimed = connection.get(claim_key(queue_name))
    if isinstance(claimed, bytes):
        claimed = claimed.decode()
    if claimed is not None and claimed != log_id:
        raise InputError(
            f"FLEET_QUEUE: the queue {queue_name!r} on this Redis carries the jobs of another "
            f"database's log (its workers claimed it within the last {CLAIM_SECONDS} s); give "
            "each database a queue of its own (FLEET_QUEUE, or `worker --queues`)")


def claim(connection: Redis, queue_names: Sequence[str], log_id: str | None) -> None:
    """Claim the queues for `log_id` for CLAIM_SECONDS; InputError if another log holds one."""
    for name in queue_names:
        check_claim(connection, name, log_id)
    if log_id is not None:
        for name in queue_names:
            connection.set(claim_key(name), log_id, ex=CLAIM_SECONDS)


class QueueClaim:
    """A serving worker's claim on its queues, renewed from its heartbeat (never raising: a
    heartbeat must not stop a worker; a claim another log took meanwhile is logged)."""

    def __init__(self, connection: Redis, queue_names: list[str],
                 log_id: Callable[[], str | None] | None) -> None:
        self.connection, self.queue_names, self.log_id = connection, queue_names, log_id
        self.renewed_at = time.monotonic()  # claimed at start-up, by the CLI

    def renew(self) -> None:
        clock = time.monotonic()
        if self.log_id is None or clock - self.renewed_at < RENEW_SECONDS:
            return
        self.renewed_at = clock
        try:
            claim(self.connection, self.queue_names, self.log_id())
        except InputError as error:
            log.error("queue_claimed_by_another_log", error=str(error))
        except Exception as error:  # Redis or the database unreachable: the next renewal tries
            log.warning("queue_claim_not_renewed", error=f"{type(error).__name__}: {error}")
