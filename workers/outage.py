"""Noticing that Redis lost the queue, so the inbox is reconciled without anyone's help.

A Redis restarted without persistence, flushed, or failed over to a replica that had not caught
up comes back empty: the queued jobs are gone, though every command is safe in the inbox. RQ's
worker rides out the outage itself (its dequeue loop reconnects) and then waits on an empty
queue. So a serving worker marks the queue (a marker key) before it reconciles the inbox, and
checks from its heartbeat that the marker is still there: a check that has to create it means
Redis lost everything written since that reconcile. The worker that re-creates it (`SET NX`:
exactly one of them) reconciles; the others see the marker and carry on. Reconciling twice is
harmless (a command already decided is not decided again), so any doubt resolves to reconcile.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import structlog
from redis import Redis
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)
# A worker checks the marker at most this often (one SET NX).
MARKER_POLL_SECONDS = 1.0


def marker_key(queue_name: str) -> str:
    return f"fleet:queue-marker:{queue_name}"


def mark_queue(connection: Redis, queue_name: str) -> None:
    """Mark the queue as holding everything accepted so far: call it before a reconcile."""
    connection.set(marker_key(queue_name), "marked")


class LostQueueWatch:
    """Calls `on_lost` when it finds the marker of `queue_name` gone (and re-creates it).

    `on_lost` failing (Redis gone again, the database unreachable) is logged, and the marker
    removed so that the next check tries again.
    """

    def __init__(self, connection: Redis, queue_name: str, owner: str,
                 on_lost: Callable[[], object] | None) -> None:
        self.connection, self.key, self.owner = connection, marker_key(queue_name), owner
        self.on_lost = on_lost
        self.checked_at = 0.0

    def check(self) -> bool:
        """True if this call found the queue lost and reconciled it."""
        clock = time.monotonic()
        if self.on_lost is None or clock - self.checked_at < MARKER_POLL_SECONDS:
            return False
        self.checked_at = clock
        try:
            created = bool(self.connection.set(self.key, self.owner, nx=True))
        except RedisError as error:  # unreachable: RQ's own loop waits for it
            log.warning("queue_marker_unreadable", error=f"{type(error).__name__}: {error}")
            return False
        if not created:
            return False
        log.warning("redis_lost_the_queue", marker=self.key)
        try:
            self.on_lost()
        except Exception as error:  # never out of a heartbeat: RQ would stop the worker
            log.warning("reconcile_after_lost_queue_failed",
                        error=f"{type(error).__name__}: {error}")
            with contextlib.suppress(RedisError):
                self.connection.delete(self.key)
            return False
        return True
