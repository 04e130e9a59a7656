"""A submit follows an up-file only to the `fleetctl up` of its own database.

An `up` killed with SIGKILL leaves its up-file; another `up`, of another database, may serve
that port by now. It answered the ping, so this database's jobs went to workers of the other
database, which skipped every command as unknown. (The Redis named here is the test's real
one, standing for the Redis the file names.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from controlplane.settings import Settings
from workers.connections import UP_DATABASE_KEY, advertised_up_url, up_database


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
