"""The one settings object, read from the environment (see README "Configuration")."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.errors import InputError

DEFAULT_DATABASE_URL = "sqlite:///fleet.db"
COMMAND_QUEUE = "fleet-commands"


def _positive_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"{name} must be a whole number, got {raw!r}") from None
    if value <= 0:
        raise InputError(f"{name} must be positive, got {value}")
    return value


def _queue_from_env() -> str:
    return os.environ.get("FLEET_QUEUE") or COMMAND_QUEUE


DEFAULT_BATCH_SIZE = 1_000


@dataclass(frozen=True)
class Settings:
    """Where the log lives, where the queue lives, and how work is batched."""

    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str | None = None
    # Each job pays about 40 ms of RQ and fork outside the append lock (measured on real
    # Redis): 1,000 commands a job decided 8-10% more a second than 500 on SQLite and PostgreSQL.
    batch_size: int = DEFAULT_BATCH_SIZE
    job_timeout_seconds: int = 600
    result_ttl_seconds: int = 3_600
    failure_ttl_seconds: int = 7 * 24 * 3_600
    queues: tuple[str, ...] = field(default_factory=lambda: (_queue_from_env(),))

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            database_url=os.environ.get("FLEET_DATABASE_URL") or DEFAULT_DATABASE_URL,
            redis_url=os.environ.get("FLEET_REDIS_URL") or None,
            batch_size=_positive_int("FLEET_BATCH_SIZE", DEFAULT_BATCH_SIZE),
            job_timeout_seconds=_positive_int("FLEET_JOB_TIMEOUT_SECONDS", 600),
        )

    @property
    def command_queue(self) -> str:
        """The queue commands are enqueued on (`FLEET_QUEUE`; fleets may share one Redis)."""
        return self.queues[0]

    @property
    def embedded_queue(self) -> bool:
        return self.redis_url is None

    @property
    def up_file(self) -> Path | None:
        """Where `fleetctl up` advertises its loopback Redis, beside a SQLite database."""
        if not self.database_url.startswith("sqlite:///"):
            return None
        path = self.database_url.removeprefix("sqlite:///")
        return Path(path + ".up.json") if path and path != ":memory:" else None
