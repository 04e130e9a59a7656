"""`fleetctl up` as a supervisor, run for real: it restarts a worker that died, gives up (exit 3)
on one that keeps dying, stops workers stuck in a job within a bounded time, and is the only
`up` serving its database."""

from __future__ import annotations

import json
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
from rq.registry import StartedJobRegistry

from controlplane.commands import command_adapter
from controlplane.runtime import open_store
from controlplane.service import accept, pending_command_ids
from controlplane.settings import COMMAND_QUEUE, STOP_GRACE_ENV, STOP_GRACE_SECONDS, Settings
from tests.cli_helpers import run_cli
from tests.conftest import reset_postgres
from tests.factories import assess_memory
from tests.process_helpers import (
    alive,
    children,
    fleetctl_environment,
    log_events,
    start_fleetctl,
    stop_and_wait,
    tree,
    wait_until,
)
from workers.processes import kill_process_tree
from workers.queue import command_queue, enqueue_commands
from workers.stranded import SWEEP_ENV
from workers.supervision import RESTART_LIMIT


@pytest.fixture
def up_processes() -> Iterator[list[subprocess.Popen[str]]]:
    """The `up` processes a test starts; whatever is left of them is killed afterwards."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        kill_process_tree(process.pid)
        process.communicate()


def start_up(sqlite_url: str, started: list[subprocess.Popen[str]], workers: int) \
        -> tuple[subprocess.Popen[str], dict[str, object]]:
    """`fleetctl up --workers N --json` and its announcement."""
    process = start_fleetctl("up", "--workers", str(workers), "--json",
                             env=fleetctl_environment(sqlite_url))
    started.append(process)
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"up ended before announcing itself: {process.communicate()[1]}"
    return process, json.loads(line)


def serving(started: dict[str, object], workers: int) -> Redis:
    """The Redis `up` announced, once `workers` workers serve on it."""
    redis = Redis.from_url(str(started["redis_url"]))
    wait_until(lambda: len(Worker.all(connection=redis)) == workers, 60,
               f"{workers} serving worker(s)")
    return redis


def up_file_of(sqlite_url: str) -> Path:
    return Path(sqlite_url.removeprefix("sqlite:///") + ".up.json")


def test_up_restarts_a_worker_that_died_and_logs_its_exit_code(
        sqlite_url: str, up_processes: list[subprocess.Popen[str]]) -> None:
    # `up` stopped serving (exit 0, silently) as soon as any worker process ended.
    up, _ = start_up(sqlite_url, up_processes, workers=2)
    wait_until(lambda: len(children(up.pid)) == 2, 60, "two worker processes")
    first = children(up.pid)
    victim = first[0]
    os.kill(victim, signal.SIGKILL)

    def replaced() -> bool:
        now = set(children(up.pid))
        return len(now) == 2 and victim not in now

    wait_until(replaced, 60, "the dead worker's replacement")
    assert up.poll() is None, "up stopped when one of its workers died"
    up.send_signal(signal.SIGTERM)
    _, stderr = up.communicate(timeout=60)
    assert up.returncode == 0, stderr
    restarts = log_events(stderr, "worker_restarted")
    assert [(r["previous_pid"], r["exit_code"]) for r in restarts] == \
        [(victim, -signal.SIGKILL)], stderr
    assert not any(alive(pid) for pid in [*first, restarts[0]["pid"]])
    assert not up_file_of(sqlite_url).exists()


def test_up_exits_3_naming_a_worker_that_keeps_dying_and_stops_the_rest(
        sqlite_url: str, up_processes: list[subprocess.Popen[str]]) -> None:
    up, started = start_up(sqlite_url, up_processes, workers=2)
    serving(started, workers=2)
    workers = children(up.pid)
    # From now on a worker process cannot start: it fails opening the database (exit 3).
    database = Path(sqlite_url.removeprefix("sqlite:///"))
    for path in (database, Path(f"{database}-wal"), Path(f"{database}-shm")):
        path.unlink(missing_ok=True)
    database.write_bytes(b"not a database " * 100)
    os.kill(workers[0], signal.SIGKILL)
    _, stderr = up.communicate(timeout=120)
    assert up.returncode == 3, stderr
    last = stderr.splitlines()[-1]
    assert last.startswith("error: worker ") and "exited with code 3" in last, last
    assert f"{RESTART_LIMIT} times in a row" in last, last
    restarts = log_events(stderr, "worker_restarted")
    assert [r["exit_code"] for r in restarts] == [-signal.SIGKILL] + [3] * (RESTART_LIMIT - 2), stderr
    assert not any(alive(pid) for pid in workers)  # the healthy one was stopped too
    assert not up_file_of(sqlite_url).exists()


def test_up_stopped_while_a_worker_is_stuck_in_a_job_kills_it_after_the_grace_period(
        sqlite_url: str, up_processes: list[subprocess.Popen[str]]) -> None:
    # `up` waited 10 s per worker, then died of TimeoutExpired: a traceback, its up-file and
    # workers left behind.
    up, started = start_up(sqlite_url, up_processes, workers=1)
    up_redis = serving(started, workers=1)
    store = open_store(sqlite_url)
    ids = accept(store, [command_adapter.validate_python(assess_memory(f"stuck{i}"))
                         for i in range(3)])
    with store.transaction():  # the job cannot append: it waits for this lock (30 s)
        enqueue_commands(up_redis, Settings(queues=(COMMAND_QUEUE,)), ids)
        registry = StartedJobRegistry(queue=command_queue(up_redis, COMMAND_QUEUE))
        wait_until(lambda: registry.count == 1 and len(tree(up.pid)) == 3, 60,
                   "the job to start in a work horse")
        stderr, stopped_in_seconds = stop_and_wait(up)
    assert up.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert stopped_in_seconds < STOP_GRACE_SECONDS, stopped_in_seconds
    assert len(log_events(stderr, "worker_killed")) == 1
    assert not up_file_of(sqlite_url).exists()
    assert sorted(pending_command_ids(store)) == sorted(ids)  # left for `reconcile`
    store.engine.dispose()


def test_a_second_up_on_the_same_database_is_refused_naming_the_live_one(
        sqlite_url: str, up_processes: list[subprocess.Popen[str]]) -> None:
    # The second `up` overwrote the first one's up-file, and the first removed it on exit.
    first, started = start_up(sqlite_url, up_processes, workers=0)
    up_file = up_file_of(sqlite_url)
    advertised = up_file.read_text()
    second = start_fleetctl("up", "--workers", "0", "--json",
                            env=fleetctl_environment(sqlite_url))
    up_processes.append(second)
    stdout, stderr = second.communicate(timeout=60)
    assert second.returncode == 3, stderr
    assert stdout == ""  # it announced nothing
    assert len(stderr.splitlines()) == 1, stderr
    assert f"pid {first.pid}" in stderr and str(up_file) in stderr, stderr
    assert up_file.read_text() == advertised
    assert json.loads(advertised) == {"redis_url": started["redis_url"], "pid": first.pid}
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)
    assert first.returncode == 0
    assert not up_file.exists()


def test_a_second_up_on_one_postgresql_database_is_refused_until_the_first_is_gone(
        postgres_database: str, up_processes: list[subprocess.Popen[str]]) -> None:
    # Two `up`s on one PostgreSQL database had both served it, each with a Redis of its own.
    reset_postgres(postgres_database)
    first, _ = start_up(postgres_database, up_processes, workers=0)
    second = start_fleetctl("up", "--workers", "0", "--json",
                            env=fleetctl_environment(postgres_database))
    up_processes.append(second)
    stdout, stderr = second.communicate(timeout=60)
    assert second.returncode == 3, stderr
    assert stdout == "" and len(stderr.splitlines()) == 1, stderr
    assert f"fleetctl up (pid {first.pid}) already serves this database" in stderr, stderr
    kill_process_tree(first.pid)  # SIGKILL: the lock goes with its session all the same
    first.communicate(timeout=60)
    third, _ = start_up(postgres_database, up_processes, workers=0)
    third.send_signal(signal.SIGTERM)
    third.communicate(timeout=60)
    assert third.returncode == 0


@pytest.mark.parametrize("holder", ["gone", "reused"])
def test_up_replaces_an_up_file_left_by_a_process_that_is_gone(
        sqlite_url: str, up_processes: list[subprocess.Popen[str]], holder: str) -> None:
    # "reused": the dead `up`'s pid now names a live process that serves nothing (pid reuse in
    # a container); judged by the pid alone, every later `up` had been refused.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    pid = gone.pid if holder == "gone" else os.getpid()
    up_file = up_file_of(sqlite_url)
    up_file.write_text(json.dumps({"redis_url": "redis://127.0.0.1:1/0", "pid": pid}))
    up, started = start_up(sqlite_url, up_processes, workers=0)
    assert json.loads(up_file.read_text()) == {"redis_url": started["redis_url"], "pid": up.pid}
    up.send_signal(signal.SIGTERM)
    up.communicate(timeout=60)
    assert up.returncode == 0
    assert not up_file.exists()


def test_up_leaves_an_up_file_that_names_another_process(
        sqlite_url: str, up_processes: list[subprocess.Popen[str]]) -> None:
    up, _ = start_up(sqlite_url, up_processes, workers=0)
    up_file = up_file_of(sqlite_url)
    taken_over = json.dumps({"redis_url": "redis://127.0.0.1:2/0", "pid": os.getpid()})
    up_file.write_text(taken_over)  # as another `up` would, had it taken a stale file over
    up.send_signal(signal.SIGTERM)
    up.communicate(timeout=60)
    assert up.returncode == 0
    assert up_file.read_text() == taken_over



@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGHUP], ids=["SIGINT", "SIGHUP"])
def test_up_stopped_by_sigint_or_sighup_stops_its_worker_and_removes_its_up_file(
        sqlite_url: str, up_processes: list[subprocess.Popen[str]], stop: signal.Signals) -> None:
    # SIGHUP (a closed terminal) killed `up` outright; its workers, in process groups of their
    # own, would have served on.
    up, _ = start_up(sqlite_url, up_processes, workers=1)
    wait_until(lambda: len(children(up.pid)) == 1, 60, "the worker process")
    worker = children(up.pid)[0]
    up.send_signal(stop)
    _, stderr = up.communicate(timeout=60)
    assert up.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert not alive(worker)
    assert not up_file_of(sqlite_url).exists()

@pytest.mark.parametrize("command", ["up", "worker"])
@pytest.mark.parametrize(("variable", "value"), [
    (STOP_GRACE_ENV, "soon"), (STOP_GRACE_ENV, "0"), (STOP_GRACE_ENV, "604801"),
    # `up` served, its workers each exited 2 on it, and it gave up with exit 3.
    (SWEEP_ENV, "0"), (SWEEP_ENV, "often"),
])
def test_a_bad_worker_setting_is_refused_naming_the_variable_and_writes_nothing(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch, command: str, variable: str,
        value: str) -> None:
    monkeypatch.setenv(variable, value)
    result = run_cli(command)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"error: {variable} must be"), result.stderr
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()



def test_workers_of_an_up_killed_with_sigkill_stop_by_themselves(
        sqlite_url: str, up_processes: list[subprocess.Popen[str]]) -> None:
    # Killed, `up` cannot stop its workers: each in a process group of its own, they served on,
    # unsupervised, for good. A worker whose parent is no longer its supervisor now stops.
    up, started = start_up(sqlite_url, up_processes, workers=1)
    serving(started, workers=1).close()
    workers = children(up.pid)
    assert workers
    os.kill(up.pid, signal.SIGKILL)
    up.wait(timeout=10)
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in workers):
        assert time.monotonic() < deadline, "a worker outlived its killed supervisor"
        time.sleep(0.2)


@pytest.mark.parametrize("processes", [1, 2])
def test_a_worker_attached_through_the_up_file_follows_a_restarted_up(
        sqlite_url: str, up_processes: list[subprocess.Popen[str]], processes: int) -> None:
    # The worker kept trying the stopped `up`'s port for good: a restarted `up` serves another
    # port, and its jobs waited with no worker.
    first, started = start_up(sqlite_url, up_processes, workers=0)
    worker = start_fleetctl("worker", "--processes", str(processes),
                            env=fleetctl_environment(sqlite_url))
    up_processes.append(worker)
    serving(started, workers=processes).close()
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)
    assert first.returncode == 0
    second, restarted = start_up(sqlite_url, up_processes, workers=0)
    assert restarted["redis_url"] != started["redis_url"]
    serving(restarted, workers=processes).close()  # the attached workers, there by themselves
    result = run_cli("submit", "--wait", "--timeout", "60", "-",
                     input_text=json.dumps(assess_memory("after-restart")))
    assert result.exit_code == 0, result.stderr
    assert "after-restart" in result.output
    assert worker.poll() is None
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    # It noticed the new `up` through the file (`up_moved`) or lost the old one's Redis first
    # (RQ quits on a reset connection); either way it connected once more, to the new one.
    assert len(log_events(stderr, "serving_again")) == processes, stderr
    second.send_signal(signal.SIGTERM)
    second.communicate(timeout=60)
