"""Workers notice a Redis that lost the queue, and a worker that quits is served again.

`LostQueueWatch` on a private fakeredis; `serve`'s restart loop with stand-in RQ workers that
quit at once, so its waits and reconciles are observed without waiting them out (a real
redis-server killed under a real worker is `tests/e2e/test_worker_outlives_redis.py`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import fakeredis
import pytest
from sqlalchemy.exc import OperationalError as DatabaseDown

from controlplane.errors import OperationalError
from workers import outage, runner
from workers.outage import LostQueueWatch, mark_queue, marker_key


@pytest.fixture
def redis() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(server=fakeredis.FakeServer())


@pytest.fixture(autouse=True)
def _check_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outage, "MARKER_POLL_SECONDS", 0.0)
    # serve() installs its own SIGTERM and SIGINT handlers while it waits: not in pytest.
    monkeypatch.setattr(runner.signal, "signal", lambda *_: None)


def test_a_marked_queue_that_vanishes_is_reconciled_by_exactly_one_worker(
        redis: fakeredis.FakeRedis) -> None:
    reconciled: list[str] = []
    watches = [LostQueueWatch(redis, "q", name, lambda name=name: reconciled.append(name))
               for name in ("w1", "w2")]
    mark_queue(redis, "q")
    assert not any(watch.check() for watch in watches) and reconciled == []
    redis.flushall()  # a restart without persistence, a flush, a failover to an empty replica
    assert [watch.check() for watch in watches] == [True, False]
    assert reconciled == ["w1"] and redis.exists(marker_key("q"))
    assert not any(watch.check() for watch in watches) and reconciled == ["w1"]


def test_a_reconcile_that_fails_is_tried_again_at_the_next_check(
        redis: fakeredis.FakeRedis) -> None:
    attempts: list[int] = []

    def reconcile() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise DatabaseDown("SELECT", {}, Exception("the database is restarting"))

    watch = LostQueueWatch(redis, "q", "w1", reconcile)
    assert watch.check() is False  # never marked: lost; its reconcile failed and is not hidden
    assert not redis.exists(marker_key("q"))
    assert watch.check() is True and len(attempts) == 2


def test_a_watch_without_a_reconcile_never_touches_redis(redis: fakeredis.FakeRedis) -> None:
    assert LostQueueWatch(redis, "q", "w1", None).check() is False
    assert redis.keys() == []


class StandIn:
    """An RQ worker that quits at once, or stops as if warm-shut-down on its last run."""

    def __init__(self, runs: list[str], stop_after: int) -> None:
        self.runs, self.stop_after = runs, stop_after
        self._shutdown_requested_date: datetime | None = None
        self.pubsub_thread = None  # it listens for no RQ command

    def work(self, **_: Any) -> bool:
        self.runs.append("run")
        if len(self.runs) >= self.stop_after:
            self._shutdown_requested_date = datetime.now(UTC)
        return False


def test_a_worker_that_keeps_quitting_is_served_again_with_growing_waits(
        redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[str] = []
    waits: list[float] = []
    reconciles: list[int] = []
    monkeypatch.setattr(runner, "_worker", lambda *a, **k: StandIn(runs, stop_after=5))
    monkeypatch.setattr(runner.time, "sleep", waits.append)
    runner.serve(lambda: redis, ["q"], lambda: reconciles.append(1))
    assert len(runs) == 5 and len(reconciles) == 4  # a reconcile before each new worker
    assert waits == [0.5, 1.0, 2.0, 4.0]  # quitting at once: the wait doubles, no busy loop
    assert redis.exists(marker_key("q"))


def test_redis_or_the_database_still_down_only_lengthens_the_wait(
        redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[str] = []
    waits: list[float] = []
    outcomes = iter(["redis down", "database down", "ok"])
    monkeypatch.setattr(runner, "_worker", lambda *a, **k: StandIn(runs, stop_after=2))
    monkeypatch.setattr(runner.time, "sleep", waits.append)
    connects = iter([redis, None, redis, redis])

    def connect() -> fakeredis.FakeRedis:
        connection = next(connects)
        if connection is None:
            raise OperationalError("Redis at redis://queue/0 is unreachable")
        return connection

    def reconcile() -> None:
        if next(outcomes) == "database down":
            raise DatabaseDown("SELECT", {}, Exception("the database is restarting"))

    next(outcomes)  # the first connect after the quit fails before any reconcile
    runner.serve(connect, ["q"], reconcile)
    assert len(runs) == 2 and waits == [0.5, 1.0, 2.0]
