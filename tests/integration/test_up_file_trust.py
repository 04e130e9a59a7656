"""A submit follows an up-file only to the `fleetctl up` of its own database.

An `up` killed with SIGKILL leaves its up-file; another `up`, of another database, may serve
that port by now. It answered the ping, so this database's jobs went to workers of the other
database, which skipped every command as unknown. (The Redis named here is the test's real
one, standing for the Redis the file names.)
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis

from controlplane.errors import OperationalError
from controlplane.settings import Settings
from workers.connections import UP_DATABASE_KEY, advertised_up_url, up_database
from workers.runner import UpFollower, _forking_worker


@pytest.fixture
def advertised(tmp_path: Path, real_redis: Redis) -> Iterator[tuple[Settings, str]]:
    """Settings of a SQLite database whose up-file names the test's Redis."""
    url = os.environ["FLEET_REDIS_URL"]
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'fleet.db'}")
    assert settings.up_file is not None
    settings.up_file.write_text(json.dumps({"redis_url": url, "pid": 1}))
    real_redis.delete(UP_DATABASE_KEY)
    yield settings, url
    real_redis.delete(UP_DATABASE_KEY)


def test_the_up_of_this_database_is_followed(
        advertised: tuple[Settings, str], real_redis: Redis) -> None:
    settings, url = advertised
    real_redis.set(UP_DATABASE_KEY, up_database(settings))
    assert advertised_up_url(settings) == url


@pytest.mark.parametrize("says", [None, "/elsewhere/other.db"], ids=["nothing", "another"])
def test_an_up_file_naming_a_redis_that_serves_another_database_is_not_followed(
        advertised: tuple[Settings, str], real_redis: Redis, says: str | None) -> None:
    settings, _ = advertised
    if says is not None:
        real_redis.set(UP_DATABASE_KEY, says)
    assert real_redis.ping()  # it answers: only what it says it serves turns the file down
    assert advertised_up_url(settings) is None


def _eventually(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_worker_attached_to_up_follows_the_file_to_a_new_up_of_its_database(
        advertised: tuple[Settings, str], real_redis: Redis) -> None:
    settings, url = advertised
    real_redis.set(UP_DATABASE_KEY, up_database(settings))
    follower = UpFollower(settings, "redis://127.0.0.1:1/0", poll_seconds=0.02).start()
    assert _eventually(follower.moved.is_set, 5)
    assert follower.connect().ping()  # the move is taken: the new `up` is followed from now on
    assert follower.url == url and not follower.moved.is_set()


def test_a_worker_attached_to_up_ignores_a_file_naming_another_databases_redis(
        advertised: tuple[Settings, str], real_redis: Redis) -> None:
    settings, _ = advertised
    real_redis.set(UP_DATABASE_KEY, "/elsewhere/other.db")
    follower = UpFollower(settings, "redis://127.0.0.1:1/0", poll_seconds=0.02).start()
    assert not _eventually(follower.moved.is_set, 0.5)
    with pytest.raises(OperationalError, match="no fleetctl up serves this database now"):
        follower.connect()  # never the in-process fake


def test_an_idle_worker_asked_to_move_ends_its_loop_without_a_warm_shutdown(
        real_redis: Redis) -> None:
    worker = _forking_worker(real_redis, [os.environ["FLEET_QUEUE"]], stop_when=lambda: True)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    # Should the request be ignored, a SIGTERM (RQ's warm shutdown) ends the loop after 10 s.
    backstop = threading.Timer(10, os.kill, (os.getpid(), signal.SIGTERM))
    backstop.start()
    started = time.monotonic()
    try:
        worker.work(burst=False, logging_level="WARNING")
    finally:
        backstop.cancel()
        for signum, handler in handlers.items():  # RQ installed its own in this process
            signal.signal(signum, handler)
    assert time.monotonic() - started < 5
    assert worker._shutdown_requested_date is None  # `serve` connects again, it does not exit
