"""The one place that builds Redis connections: a real server by URL, or the embedded fake."""

from __future__ import annotations

import json
from functools import lru_cache

import fakeredis
from redis import Redis
from redis.connection import SSLConnection
from redis.exceptions import AuthenticationError, ResponseError

from controlplane.errors import InputError, OperationalError
from controlplane.settings import Settings


@lru_cache(maxsize=1)
def embedded_server() -> fakeredis.FakeServer:
    """The process's embedded fake Redis server, shared by every embedded connection."""
    return fakeredis.FakeServer()


# Where a `fleetctl up` says, in the Redis it serves, which database it serves.
UP_DATABASE_KEY = "fleet:up:database"


def up_database(settings: Settings) -> str:
    """How `up` names its database in the Redis it serves: the SQLite file, resolved."""
    return str(settings.sqlite_path.resolve()) if settings.sqlite_path is not None else ""


def advertised_up_url(settings: Settings) -> str | None:
    """The loopback URL of a running `fleetctl up` for this database, if one answers there and
    says it serves this database: a file left by an `up` killed with SIGKILL can name a port
    another `up`, of another database, serves by now (its jobs would have gone there)."""
    path = settings.up_file
    if path is None or not path.exists():
        return None
    try:
        url = str(json.loads(path.read_text())["redis_url"])
        served = Redis.from_url(url, socket_connect_timeout=0.5).get(UP_DATABASE_KEY)
    except (OSError, ValueError, KeyError, Exception):
        return None
    if isinstance(served, bytes):
        served = served.decode()
    return url if served == up_database(settings) else None


def redis_url_in_use(settings: Settings) -> str | None:
    """`FLEET_REDIS_URL`, else a running `fleetctl up`, else None for the in-process fake."""
    return settings.redis_url or advertised_up_url(settings)


def queue_connection(settings: Settings) -> Redis:
    """A Redis connection for the queue, not used yet; InputError when the URL is malformed."""
    url = redis_url_in_use(settings)
    if url is None:
        return fakeredis.FakeRedis(server=embedded_server())
    try:
        return Redis.from_url(url, socket_connect_timeout=5)
    except ValueError:
        raise InputError("FLEET_REDIS_URL is not a valid Redis URL") from None


def connect_to_up(settings: Settings) -> tuple[str, Redis]:
    """The URL and a connection of the `fleetctl up` serving this database now, found through
    its up-file; OperationalError while none does. Never the in-process fake: a worker attached
    to `up` has nothing to serve there, and would decide the backlog alone, unseen."""
    url = advertised_up_url(settings)
    if url is None:
        raise OperationalError(f"no fleetctl up serves this database now ({settings.up_file} "
                               "names none that answers)")
    return url, reachable(Redis.from_url(url, socket_connect_timeout=5))


def reachable(connection: Redis) -> Redis:
    """`connection` once it answers; OperationalError, naming no password, when it does not."""
    problem = probe(connection)
    if problem is not None:
        raise problem
    return connection


def probe(connection: Redis) -> OperationalError | None:
    """None when `connection` answers; the OperationalError to raise when Redis is unreachable.

    A server that answers but refuses what the URL asks (a database index past its
    `databases`, a wrong password) is a configuration error, not an outage: InputError now,
    so that a caller that probes first writes nothing.
    """
    try:
        connection.ping()
    except (ResponseError, AuthenticationError) as error:
        raise InputError(f"FLEET_REDIS_URL: the Redis at {_address(connection)} refuses it: "
                         f"{error}") from None
    except Exception as error:  # redis raises several unrelated types for "unreachable"
        return OperationalError(f"Redis at {_address(connection)} is unreachable: {error}")
    return None


def connect(settings: Settings) -> Redis:
    """A Redis connection for the queue; raises OperationalError when a real one is unreachable."""
    return reachable(queue_connection(settings))


def _address(connection: Redis) -> str:
    """Where `connection` goes, without its user name or password."""
    options = connection.connection_pool.connection_kwargs
    if "path" in options:
        return f"unix://{options['path']}"
    scheme = "rediss" if issubclass(connection.connection_pool.connection_class,
                                    SSLConnection) else "redis"
    return f"{scheme}://{options.get('host')}:{options.get('port')}/{options.get('db', 0)}"
