"""Shared fixtures: a fresh log on SQLite and (when configured) PostgreSQL; fake and real Redis.

With FLEET_TEST_DATABASE_URL / FLEET_TEST_REDIS_URL set, the real-server variants run and FAIL
(never skip) when the server is unreachable. Each test gets its own empty database or Redis db.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator

import fakeredis
import pytest
from redis import Redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from controlplane.runtime import open_store
from events.store import EventStore

PG_URL = os.environ.get("FLEET_TEST_DATABASE_URL")
REDIS_URL = os.environ.get("FLEET_TEST_REDIS_URL")


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A database of our own on the test server, created for this session and dropped after."""
    if not PG_URL:
        pytest.skip("FLEET_TEST_DATABASE_URL is not set")
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    name = f"fleet_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:  # fails loudly if the server is unreachable
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    open_store(url).engine.dispose()
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def reset_postgres(url: str) -> None:
    """Empty the log and projections of the test database at `url`."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE events, projections"))
        # Deleted and written again: a test may have deleted the head row itself.
        conn.execute(text("DELETE FROM log_head"))
        conn.execute(text("INSERT INTO log_head (id, position, hash) VALUES (1, 0, :h)"),
                     {"h": "0" * 64})
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: object,
                 monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty, migrated log; also exported as FLEET_DATABASE_URL for workers and the CLI."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/fleet.db"
    else:
        url = request.getfixturevalue("postgres_database")
        reset_postgres(url)
    monkeypatch.setenv("FLEET_DATABASE_URL", url)
    return url


@pytest.fixture
def sqlite_url(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path}/fleet.db"
    monkeypatch.setenv("FLEET_DATABASE_URL", url)
    return url


@pytest.fixture
def store(database_url: str) -> Iterator[EventStore]:
    event_store = open_store(database_url)
    yield event_store
    event_store.engine.dispose()


def forget_queue(connection: Redis, queue_name: str) -> None:
    """Delete every key of one queue (its list, registries, jobs, results): as if Redis lost it."""
    keys = list(connection.scan_iter(match=f"*{queue_name}*", count=1_000))
    if keys:
        connection.delete(*keys)


def forget_everything_of(connection: Redis, queue_name: str) -> None:
    """`forget_queue`, and what RQ keeps of a queue outside its own keys: its entry in the set of
    queues, the registrations of workers that served it (killed ones never deregister), and
    jobs whose ids do not name it (a test's foreign jobs) with their results."""
    forget_queue(connection, queue_name)
    connection.srem("rq:queues", f"rq:queue:{queue_name}")
    for key in connection.smembers("rq:workers"):
        queues = connection.hget(key, "queues") or b""
        if queue_name.encode() in queues.split(b","):
            connection.delete(key)
            connection.srem("rq:workers", key)
    for key in connection.scan_iter(match="rq:job:*", count=1_000):
        job_id = key.decode().removeprefix("rq:job:")
        if ":" in job_id or connection.type(key) != b"hash":  # a job's dependents, not a job
            continue
        if connection.hget(key, "origin") == queue_name.encode():
            connection.delete(key, f"rq:results:{job_id}")


@pytest.fixture
def real_redis(monkeypatch: pytest.MonkeyPatch) -> Iterator[Redis]:
    """The real test Redis with a queue of this test's own, removed after; exported for workers.

    A private queue name (not FLUSHDB) keeps concurrent test runs on one server apart.
    """
    if not REDIS_URL:
        pytest.skip("FLEET_TEST_REDIS_URL is not set")
    connection = Redis.from_url(REDIS_URL)
    connection.ping()  # fails loudly if the server is unreachable
    queue_name = f"fleet-test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("FLEET_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("FLEET_QUEUE", queue_name)
    yield connection
    forget_everything_of(connection, queue_name)
    connection.close()


@pytest.fixture(params=["fakeredis", "redis"])
def queue_redis(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Redis:
    """A queue connection: a private fake Redis, or the real one."""
    if request.param == "fakeredis":
        monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
        monkeypatch.setenv("FLEET_QUEUE", "fleet-commands")
        return fakeredis.FakeRedis(server=fakeredis.FakeServer())
    return request.getfixturevalue("real_redis")  # type: ignore[no-any-return]


@pytest.fixture(autouse=True, scope="session")
def _quiet_logs() -> None:
    from controlplane.logging import configure_logging

    configure_logging("WARNING")


@pytest.fixture
def embedded_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """No real Redis: commands are decided in-process on the embedded fake."""
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)


@pytest.fixture
def redis_server_binary() -> None:
    """The Redis-restart runs start a private redis-server: skip with the real-server suites off,
    fail when they are on and the binary is missing."""
    if not os.environ.get("FLEET_TEST_REDIS_URL"):
        pytest.skip("FLEET_TEST_REDIS_URL is not set")
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not on PATH: the Redis-restart fault runs need it")
