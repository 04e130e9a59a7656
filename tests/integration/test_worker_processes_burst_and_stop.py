"""`fleetctl worker --processes N` on a real Redis, run for real: with --burst every process
drains the queue and exits, a failed one makes the run exit 3, and a signal stops them all
within the grace period, work horses too, without a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from redis import Redis
from rq import Worker
from rq.registry import StartedJobRegistry

from controlplane.commands import command_adapter
from controlplane.runtime import open_store
from controlplane.service import accept, pending_command_ids
from controlplane.settings import STOP_GRACE_SECONDS, Settings
from events.store import EventStore
from tests.factories import assess_memory
from tests.process_helpers import (
    children,
    fleetctl_environment,
    start_fleetctl,
    stop_and_wait,
    tree,
    wait_until,
)
from workers.processes import kill_process_tree
from workers.queue import command_queue, enqueue_commands


@pytest.fixture
def workers_run(sqlite_url: str, real_redis: Redis) -> Iterator[list[subprocess.Popen[str]]]:
    """The `fleetctl worker` processes a test starts; whatever is left of them is killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        kill_process_tree(process.pid)
        process.communicate()


def start_workers(sqlite_url: str, started: list[subprocess.Popen[str]],
                  *args: str) -> subprocess.Popen[str]:
    environment = fleetctl_environment(sqlite_url, FLEET_REDIS_URL=os.environ["FLEET_REDIS_URL"],
                                       FLEET_QUEUE=os.environ["FLEET_QUEUE"])
    process = start_fleetctl("worker", *args, env=environment)
    started.append(process)
    return process


def accept_and_enqueue(store: EventStore, redis: Redis, count: int, batch_size: int) -> list[str]:
    """`count` accepted commands, enqueued in jobs of `batch_size` on the test's queue."""
    ids = accept(store, [command_adapter.validate_python(assess_memory(f"w{i:03d}"))
                         for i in range(count)])
    enqueue_commands(redis, Settings(batch_size=batch_size, queues=(os.environ["FLEET_QUEUE"],)),
                     ids)
    return ids


def started_jobs(redis: Redis) -> int:
    return StartedJobRegistry(queue=command_queue(redis, os.environ["FLEET_QUEUE"])).count


def serving(redis: Redis) -> list[str]:
    """The names of the workers registered on the test's queue."""
    return [worker.name for worker in
            Worker.all(queue=command_queue(redis, os.environ["FLEET_QUEUE"]))]


def test_burst_with_several_processes_drains_the_queue_and_every_process_exits(
        sqlite_url: str, real_redis: Redis, workers_run: list[subprocess.Popen[str]]) -> None:
    # The extra processes were started without --burst: they served forever and the first one
    # waited for them forever.
    store = open_store(sqlite_url)
    accept_and_enqueue(store, real_redis, count=60, batch_size=5)
    run = start_workers(sqlite_url, workers_run, "--burst", "--processes", "3")
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 0, stderr
    assert pending_command_ids(store) == [], stderr
    assert command_queue(real_redis, os.environ["FLEET_QUEUE"]).count == 0, stderr
    assert serving(real_redis) == [], stderr  # every worker ended, none left serving
    store.engine.dispose()


def test_a_burst_process_that_fails_makes_the_run_exit_3_naming_it(
        sqlite_url: str, real_redis: Redis, workers_run: list[subprocess.Popen[str]]) -> None:
    store = open_store(sqlite_url)
    accept_and_enqueue(store, real_redis, count=10, batch_size=5)
    with store.transaction():  # jobs wait for this lock: both processes are busy when one dies
        run = start_workers(sqlite_url, workers_run, "--burst", "--processes", "2")
        wait_until(lambda: started_jobs(real_redis) == 2, 60, "both processes to take a job")
        victim = children(run.pid)[0]
        kill_process_tree(victim)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 3, stderr
    last = stderr.splitlines()[-1]
    assert last.startswith("error: 1 of 2 worker processes failed: worker "), last
    assert last.endswith(f"(pid {victim}) was killed by SIGKILL"), last
    store.engine.dispose()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_a_burst_of_several_processes_within_the_grace_period(
        sqlite_url: str, real_redis: Redis, workers_run: list[subprocess.Popen[str]],
        stop: signal.Signals) -> None:
    # The first process waited for the others forever; a SIGTERM then printed StopRequested's
    # traceback and left them running.
    store = open_store(sqlite_url)
    ids = accept_and_enqueue(store, real_redis, count=10, batch_size=5)
    with store.transaction():  # the jobs cannot append: they wait for this lock (30 s)
        run = start_workers(sqlite_url, workers_run, "--burst", "--processes", "2")
        wait_until(lambda: started_jobs(real_redis) == 2 and len(tree(run.pid)) == 5, 60,
                   "both processes to run a job in a work horse")
        stderr, stopped_in_seconds = stop_and_wait(run, stop)
    assert run.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.splitlines()[-1].startswith("error: interrupted"), stderr
    assert stopped_in_seconds < STOP_GRACE_SECONDS, stopped_in_seconds
    assert sorted(pending_command_ids(store)) == sorted(ids)  # left for `reconcile`
    store.engine.dispose()


def test_serving_processes_stuck_in_jobs_are_killed_after_the_grace_period_on_sigterm(
        sqlite_url: str, real_redis: Redis, workers_run: list[subprocess.Popen[str]]) -> None:
    # The first process only asked the others to stop and left: they, and their work horses,
    # ran on.
    store = open_store(sqlite_url)
    run = start_workers(sqlite_url, workers_run, "--processes", "2")
    wait_until(lambda: len(serving(real_redis)) == 2, 60, "two serving workers")
    ids = accept(store, [command_adapter.validate_python(assess_memory(f"s{i}"))
                         for i in range(10)])
    with store.transaction():  # the jobs cannot append: they wait for this lock (30 s)
        enqueue_commands(real_redis, Settings(batch_size=5, queues=(os.environ["FLEET_QUEUE"],)),
                         ids)
        wait_until(lambda: started_jobs(real_redis) == 2 and len(tree(run.pid)) == 5, 60,
                   "both processes to run a job in a work horse")
        stderr, stopped_in_seconds = stop_and_wait(run)
    assert run.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert stopped_in_seconds < STOP_GRACE_SECONDS, stopped_in_seconds
    store.engine.dispose()


def test_a_signal_stops_a_lone_burst_worker_after_its_job_with_exit_130(
        sqlite_url: str, real_redis: Redis, workers_run: list[subprocess.Popen[str]]) -> None:
    # It exited 0 as if it had drained the queue.
    store = open_store(sqlite_url)
    ids = accept_and_enqueue(store, real_redis, count=10, batch_size=5)
    with store.transaction():  # the job in hand waits for this lock
        run = start_workers(sqlite_url, workers_run, "--burst")
        wait_until(lambda: started_jobs(real_redis) == 1 and len(tree(run.pid)) == 2, 60,
                   "the job to start in a work horse")
        run.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the signal is handled while the job waits
    _, stderr = run.communicate(timeout=60)  # the job in hand ends, the next is not taken
    assert run.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.splitlines()[-1].startswith("error: interrupted"), stderr
    assert 0 < len(pending_command_ids(store)) < len(ids)
    store.engine.dispose()



def test_the_log_level_given_on_the_command_line_reaches_every_worker_process(
        sqlite_url: str, real_redis: Redis, workers_run: list[subprocess.Popen[str]]) -> None:
    # Before, `fleetctl --log-level INFO worker --processes 2` printed nothing: the processes it
    # started logged at FLEET_LOG_LEVEL's level (WARNING), not the option's.
    store = open_store(sqlite_url)
    accept_and_enqueue(store, real_redis, count=10, batch_size=5)
    environment = fleetctl_environment(sqlite_url, FLEET_REDIS_URL=os.environ["FLEET_REDIS_URL"],
                                       FLEET_QUEUE=os.environ["FLEET_QUEUE"])
    environment.pop("FLEET_LOG_LEVEL", None)
    run = start_fleetctl("--log-level", "INFO", "worker", "--burst", "--processes", "2",
                         env=environment)
    workers_run.append(run)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 0, stderr
    batches = [json.loads(line) for line in stderr.splitlines() if '"batch_decided"' in line]
    assert sum(batch["decided_now"] for batch in batches) == 10, stderr
    assert len({batch["job_pid"] for batch in batches}) >= 2, stderr  # more than one process
    store.engine.dispose()
