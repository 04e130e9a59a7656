"""The one settings object, read from the environment (see README "Configuration")."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from controlplane.errors import InputError

DEFAULT_DATABASE_URL = "sqlite:///fleet.db"
COMMAND_QUEUE = "fleet-commands"
# A decide job refuses more ids than this (workers.jobs.MAX_IDS_PER_JOB, the same number): a
# larger batch would fail every job it makes, and nothing would ever be decided.
MAX_BATCH_SIZE = 10_000
# RQ turns the timeout into a Redis expiry; past about a week a job is lost, not slow.
MAX_JOB_TIMEOUT_SECONDS = 7 * 24 * 3_600
# Worker processes one `fleetctl worker` or `fleetctl up` starts: decisions serialise on the
# append lock, so past a machine's cores more processes add contention, not throughput.
MAX_WORKER_PROCESSES = 64


def positive_int_from_env(name: str, default: int, maximum: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    # ASCII digits only, as written: Python's int() also reads " 5", "+5", "1_000" and
    # Arabic-Indic digits, which no other setting or option accepts.
    if not re.fullmatch(r"-?[0-9]+", raw):
        raise InputError(f"{name} must be a whole number, got {raw[:40]!r}")
    value = int(raw)
    if value <= 0:
        raise InputError(f"{name} must be positive, got {value}")
    if value > maximum:
        raise InputError(f"{name} must be at most {maximum}, got {value}")
    return value


# RQ job ids (ours embed the queue name: workers.queue.batch_job_id) take only these.
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}")
# Redis numbers its databases with a signed 32-bit index; how many a server has is its config.
_MAX_REDIS_DB = 2**31 - 1
REDIS_SCHEMES = ("redis", "rediss", "unix")


def checked_queue_name(name: str, source: str) -> str:
    """`name` when it can name an RQ queue and our job ids; InputError naming `source` if not."""
    if not _QUEUE_NAME.fullmatch(name):
        raise InputError(f"{source} must be 1 to 100 letters, digits, '_' or '-' (it is part of "
                         f"every job id), got {name[:40]!r}")
    return name


def checked_redis_url(url: str, source: str = "FLEET_REDIS_URL") -> str:
    """`url` when Redis can be reached by it as written; InputError naming `source` if not.

    redis-py reads a database index it cannot parse as 0: `redis://host/abc` would silently
    share database 0 with another fleet, so the index must be a whole number here.
    """
    parts = urlsplit(url)
    if parts.scheme not in REDIS_SCHEMES:
        raise InputError(f"{source} must start with redis://, rediss:// or unix://, "
                         f"got {redacted_url(url)[:60]!r}")
    try:
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError:
        raise InputError(f"{source} has a port that is not a number from 0 to 65535") from None
    indexes = [value for key, value in _query_pairs(parts.query) if key == "db"]
    if parts.scheme != "unix" and parts.path.strip("/"):
        indexes.append(parts.path.strip("/"))
    for index in indexes:
        if not (index.isascii() and index.isdigit()) or int(index) > _MAX_REDIS_DB:
            raise InputError(f"{source} names database {index[:20]!r}; a Redis database is a "
                             f"whole number from 0 to {_MAX_REDIS_DB}")
    if len({int(index) for index in indexes}) > 1:  # redis-py takes the query's, we showed the path's
        raise InputError(f"{source} names more than one database ({', '.join(indexes)}); name "
                         "one, in the path or as ?db=")
    _check_connection_options(url, source)
    return url


def _check_connection_options(url: str, source: str) -> None:
    """InputError when redis-py refuses an option of `url` (an unknown one, `ssl_cert_reqs=bogus`,
    `protocol=9`), found by building a connection object, which connects only when used: before,
    a submission was recorded in the inbox and the refusal reported as an unreachable Redis."""
    from redis import Redis  # only when a Redis URL is set: the embedded default needs none
    from redis.exceptions import RedisError

    try:
        pool = Redis.from_url(url).connection_pool
        pool.connection_class(**pool.connection_kwargs)
    except (TypeError, ValueError, RedisError) as error:  # its messages hold no password
        raise InputError(f"{source} asks for a connection option Redis clients refuse: "
                         f"{error}") from None


def _query_pairs(query: str) -> list[tuple[str, str]]:
    return [(key, value) for key, _, value in (pair.partition("=")
                                                for pair in query.split("&") if pair)]


def _queue_from_env() -> str:
    return checked_queue_name(os.environ.get("FLEET_QUEUE") or COMMAND_QUEUE, "FLEET_QUEUE")


# What SQLAlchemy's SQLite driver takes from a URL's query; it ignores (with a warning) any
# other argument unless `uri=true` hands them all to SQLite.
SQLITE_DRIVER_ARGUMENTS = frozenset(("timeout", "isolation_level", "detect_types",
                                     "check_same_thread", "cached_statements", "uri"))


def in_memory_sqlite(url: str) -> bool:
    """Whether `url` names a SQLite database in memory, which keeps nothing past its process."""
    base, _, query = url.partition("?")
    scheme, _, rest = base.partition("://")
    return scheme.split("+")[0] == "sqlite" and (
        rest in ("", "/", "/:memory:") or "mode=memory" in query
        or (":memory:" in rest and "uri=true" in query.lower()))


def _database_url_from_env() -> str:
    url = os.environ.get("FLEET_DATABASE_URL") or DEFAULT_DATABASE_URL
    if in_memory_sqlite(url):
        raise InputError("FLEET_DATABASE_URL names a SQLite database in memory, which keeps "
                         "nothing once this fleetctl exits: name a file (sqlite:///PATH) or a "
                         "PostgreSQL database")
    base, _, query = url.partition("?")
    if base.split("://")[0].split("+")[0] == "sqlite":
        pairs = _query_pairs(query)
        ignored = sorted({key for key, _ in pairs if key not in SQLITE_DRIVER_ARGUMENTS})
        if ignored and ("uri", "true") not in {(k, v.lower()) for k, v in pairs}:
            raise InputError(
                f"FLEET_DATABASE_URL passes {', '.join(map(repr, ignored))} to SQLite, which "
                "ignores it unless the URL also says uri=true (without it, "
                "`sqlite:///file::memory:?cache=shared` names a file called `file::memory:`): "
                "drop it, or add uri=true")
    return url


def _redis_url_from_env() -> str | None:
    raw = os.environ.get("FLEET_REDIS_URL") or None
    return None if raw is None else checked_redis_url(raw)


DEFAULT_BATCH_SIZE = 1_000
# A worker process `up` or `worker --processes N` stops may finish the job in hand (RQ's warm
# shutdown) for this long; then it is killed with its work horse, and that job's commands stay
# in the inbox for `reconcile` (`workers.supervision`). The tests shorten it.
STOP_GRACE_SECONDS = 10
STOP_GRACE_ENV = "FLEET_STOP_GRACE_SECONDS"


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
    stop_grace_seconds: int = STOP_GRACE_SECONDS

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            database_url=_database_url_from_env(),
            redis_url=_redis_url_from_env(),
            batch_size=positive_int_from_env("FLEET_BATCH_SIZE", DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE),
            job_timeout_seconds=positive_int_from_env("FLEET_JOB_TIMEOUT_SECONDS", 600,
                                              MAX_JOB_TIMEOUT_SECONDS),
            stop_grace_seconds=positive_int_from_env(STOP_GRACE_ENV, STOP_GRACE_SECONDS,
                                                     MAX_JOB_TIMEOUT_SECONDS),
        )

    @property
    def command_queue(self) -> str:
        """The queue commands are enqueued on (`FLEET_QUEUE`; fleets may share one Redis)."""
        return self.queues[0]

    @property
    def embedded_queue(self) -> bool:
        return self.redis_url is None

    @property
    def sqlite_path(self) -> Path | None:
        """The file of a SQLite database (None for another database or one in memory)."""
        if not self.database_url.startswith("sqlite:///"):
            return None
        path = self.database_url.removeprefix("sqlite:///").split("?", 1)[0]
        return Path(path) if path and path != ":memory:" else None

    @property
    def up_file(self) -> Path | None:
        """Where `fleetctl up` advertises its loopback Redis, beside a SQLite database."""
        path = self.sqlite_path
        return None if path is None else Path(f"{path}.up.json")


def redacted_url(url: str) -> str:
    """The URL's scheme, host, port and path only, and a Redis `db` given in the query: no
    user info, no other query (passwords live there)."""
    if "://" not in url:  # not a URL: a label such as "sqlite (temporary)"
        return url
    parts = urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # not a number: left out, as anything unparsed
        port = ""
    index = [value for key, value in _query_pairs(parts.query) if key == "db"][:1]
    database = f"?db={index[0][:20]}" if index and parts.scheme in REDIS_SCHEMES else ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}{database}"
