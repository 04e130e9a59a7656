"""A serving worker outlives its Redis: it waits for it, reconciles the inbox, and goes on.

A private redis-server without persistence is SIGKILLed under a real `fleetctl worker` (a
forking RQ worker), so the queue is lost; commands accepted while it is down (a submission whose
enqueue failed) are decided once it is back, by the same worker process, with nobody running
`reconcile` by hand. A warm shutdown still stops it at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis
from rq import Worker

from controlplane.commands import command_adapter
from controlplane.faults.harness import RedisServer
from controlplane.runtime import open_store
from controlplane.service import accept, pending_command_ids
from controlplane.settings import Settings
from tests.e2e.test_worker_killed import decision_counts
from tests.factories import assess_memory
from workers.processes import descendants
from workers.queue import command_queue, enqueue_commands

pytestmark = pytest.mark.slow
QUEUE = "fleet-outage"


@pytest.fixture
def redis_server(redis_server_binary: None, tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


def commands(prefix: str, count: int) -> list[object]:
    return [command_adapter.validate_python(assess_memory(f"{prefix}{i:03d}", layers=1 + i % 40))
            for i in range(count)]


def wait_until(condition: object, seconds: float, what: str,
               worker: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert worker.poll() is None, f"the worker exited ({worker.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("when", ["idle", "mid_job"])
def test_a_serving_worker_waits_out_a_lost_redis_and_decides_what_was_accepted_meanwhile(
        when: str, sqlite_url: str, redis_server: RedisServer, tmp_path: Path) -> None:
    """Idle, RQ's dequeue loop rides out the outage and the worker notices the queue is gone;
    mid-job, RQ's bookkeeping fails, its worker quits, and ours waits for Redis and serves on."""
    store = open_store(sqlite_url)
    env = {**os.environ, "FLEET_DATABASE_URL": sqlite_url, "FLEET_REDIS_URL": redis_server.url,
           "FLEET_QUEUE": QUEUE}
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log_file:
        worker = subprocess.Popen([sys.executable, "-m", "controlplane.cli.main", "worker"],
                                  env=env, start_new_session=True, stdout=log_file,
                                  stderr=subprocess.STDOUT)
    try:
        redis = Redis.from_url(redis_server.url)
        queue = command_queue(redis, QUEUE)
        wait_until(lambda: Worker.count(queue=queue) == 1, 30, "the worker registered", worker)
        before = accept(store, commands("before-", 50))
        enqueue_commands(redis, Settings(batch_size=10, queues=(QUEUE,)), before)
        wait_until(lambda: not pending_command_ids(store), 30, "the first commands were decided",
                   worker)

        if when == "mid_job":  # one batch long enough to be killed under
            busy = accept(store, commands("busy-", 1_500))
            enqueue_commands(redis, Settings(batch_size=1_500, queues=(QUEUE,)), busy)
            wait_until(lambda: bool(descendants(worker.pid)), 30, "the batch started", worker)
        redis_server.kill()  # queue, registries and the worker's registration are gone
        during = accept(store, commands("during-", 50))  # enqueueing them would fail now
        time.sleep(1.5)  # long enough for the worker to notice on its heartbeat
        redis_server.start()  # empty

        wait_until(lambda: not pending_command_ids(store), 60,
                   "the commands accepted during the outage were decided", worker)
        counts = decision_counts(store)
        assert set(counts.values()) == {1} and set(before + during) <= set(counts)
        assert len(counts) == len(before) + len(during) + (1_500 if when == "mid_job" else 0)
        wait_until(lambda: Worker.count(queue=queue) == 1, 30, "the worker registered again",
                   worker)

        worker.send_signal(signal.SIGTERM)  # warm shutdown: it stops, it does not wait again
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
        store.engine.dispose()
        print(log_path.read_text()[-3_000:])
