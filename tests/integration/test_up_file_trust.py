"""A submit follows an up-file only to the `fleetctl up` of its own database.

An `up` killed with SIGKILL leaves its up-file; another `up`, of another database, may serve
that port by now. It answered the ping, so this database's jobs went to workers of the other
database, which skipped every command as unknown.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from controlplane.settings import Settings
from workers.connections import UP_DATABASE_KEY, advertised_up_url, up_database
from workers.runner import EmbeddedRedisServer


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Settings, EmbeddedRedisServer]]:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'fleet.db'}")
    with EmbeddedRedisServer() as server:
        assert settings.up_file is not None
        settings.up_file.write_text(json.dumps({"redis_url": server.url, "pid": 1}))
        yield settings, server


def test_the_up_of_this_database_is_followed(
        served: tuple[Settings, EmbeddedRedisServer]) -> None:
    settings, server = served
    Redis.from_url(server.url).set(UP_DATABASE_KEY, up_database(settings))
    assert advertised_up_url(settings) == server.url


@pytest.mark.parametrize("says", [None, "/elsewhere/other.db"], ids=["nothing", "another"])
def test_an_up_file_naming_a_redis_that_serves_another_database_is_not_followed(
        served: tuple[Settings, EmbeddedRedisServer], says: str | None) -> None:
    settings, server = served
    if says is not None:
        Redis.from_url(server.url).set(UP_DATABASE_KEY, says)
    assert advertised_up_url(settings) is None  # decided here instead, or by this database's
