"""Accepted commands no job will decide are enqueued again by a serving worker, and a burst
worker delivers retries and says when jobs failed for good.

Before, with a healthy worker serving, such commands stayed undecided until someone ran
`fleetctl reconcile`: after Redis came back from a snapshot older than their jobs, after a job
used up its retries while the database was down, or for ten minutes after a work horse was
killed with no worker started after it. A burst worker exited 0 with its failed job parked for
a retry and its commands undecided; a worker serving `--queues B` sent its reconcile and the
follow-ups it issued to FLEET_QUEUE, which nobody served.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import fakeredis
import pytest
from redis import Redis
from rq import Queue, Retry, Worker
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from controlplane.commands import command_adapter
from controlplane.runtime import open_store
from controlplane.service import accept, pending_command_ids
from controlplane.settings import Settings
from tests.conftest import forget_everything_of
from tests.factories import assess_memory
from tests.integration.test_autoscaling_commands import fleet, observe
from tests.process_helpers import fleetctl_environment, start_fleetctl, stop_and_wait, wait_until
from workers.pipeline import reconcile
from workers.processes import kill_process_tree
from workers.queue import DECIDE_JOB, batch_job_id, command_queue, enqueue_commands
from workers.runner import drain
from workers.stranded import Inbox, StrandedCommandsWatch


class Recording:
    """An inbox whose undecided commands a test sets, recording what is enqueued again."""

    def __init__(self, *undecided: str) -> None:
        self.undecided = list(undecided)
        self.enqueued: list[list[str]] = []

    def inbox(self) -> Inbox:
        return Inbox(lambda: self.undecided, lambda _, ids: self.enqueued.append(ids))


def look(watch: StrandedCommandsWatch) -> list[str]:
    """One look now, whatever the period (and another worker's lock) says."""
    watch.checked_at = float("-inf")
    watch.connection.delete(f"fleet:stranded-sweep:{watch.queues[0].name}")
    return watch.check()


@pytest.fixture
def fake_queue() -> Queue:
    return Queue("fleet-commands", connection=fakeredis.FakeRedis(server=fakeredis.FakeServer()),
                 serializer=JSONSerializer)


def test_commands_undecided_at_two_idle_looks_are_enqueued_again(fake_queue: Queue) -> None:
    inbox = Recording("a", "b")
    watch = StrandedCommandsWatch(fake_queue.connection, [fake_queue], inbox.inbox())
    assert look(watch) == []  # the first look only notes them: a submitter may be enqueuing
    inbox.undecided = ["b", "c"]  # a decided meanwhile, c accepted since
    assert look(watch) == ["b"]
    assert inbox.enqueued == [["b"]]


def test_nothing_is_enqueued_again_while_the_queue_holds_a_job(fake_queue: Queue) -> None:
    inbox = Recording("a")
    watch = StrandedCommandsWatch(fake_queue.connection, [fake_queue], inbox.inbox())
    assert look(watch) == []
    enqueue_commands(fake_queue.connection, Settings(queues=(fake_queue.name,)), ["a"])
    assert look(watch) == [] and look(watch) == []  # a job will decide it
    fake_queue.empty()
    assert look(watch) == []  # idle again: noted afresh, not at once
    assert look(watch) == ["a"]


def test_one_worker_looks_per_period(fake_queue: Queue) -> None:
    inbox = Recording("a")
    first = StrandedCommandsWatch(fake_queue.connection, [fake_queue], inbox.inbox())
    second = StrandedCommandsWatch(fake_queue.connection, [fake_queue], inbox.inbox())
    assert look(first) == []
    second.checked_at = float("-inf")
    assert second.check() == []  # the lock is the first one's for this period
    assert second.seen is None


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        kill_process_tree(process.pid)
        process.communicate()


def test_a_serving_worker_decides_accepted_commands_no_job_points_at(
        sqlite_url: str, real_redis: Redis, processes: list[subprocess.Popen[str]]) -> None:
    """As after Redis came back from a snapshot that had the queue's marker but not the job."""
    store = open_store(sqlite_url)
    worker = start_fleetctl("worker", env=worker_env(sqlite_url, FLEET_SWEEP_SECONDS="1"))
    processes.append(worker)
    queue = command_queue(real_redis, os.environ["FLEET_QUEUE"])
    wait_until(lambda: bool(Worker.all(queue=queue)), 60, "the worker to serve")
    accept(store, [command_adapter.validate_python(assess_memory(f"lost{i}"))
                   for i in range(3)])  # accepted; their job never reached Redis
    wait_until(lambda: not pending_command_ids(store), 30, "the stranded commands decided")
    stderr, _ = stop_and_wait(worker)
    assert "stranded_commands_enqueued" in stderr
    store.engine.dispose()


def worker_env(sqlite_url: str, **extra: str) -> dict[str, str]:
    """A `fleetctl worker` environment on the test's Redis and queue."""
    return fleetctl_environment(sqlite_url, FLEET_REDIS_URL=os.environ["FLEET_REDIS_URL"],
                                FLEET_QUEUE=os.environ["FLEET_QUEUE"], **extra)


def burst(sqlite_url: str, *args: str) -> tuple[int, str]:
    """`fleetctl worker --burst ARGS` run to its end: (exit code, stderr)."""
    run = start_fleetctl("worker", "--burst", *args, env=worker_env(sqlite_url))
    _, stderr = run.communicate(timeout=120)
    return run.returncode, stderr


@contextmanager
def other_queue(redis: Redis) -> Iterator[str]:
    """A queue besides the test's (FLEET_QUEUE), removed after."""
    name = f"{os.environ['FLEET_QUEUE']}-b"
    try:
        yield name
    finally:
        forget_everything_of(redis, name)


def failing_job(redis: Redis) -> str:
    """A decide job that fails every time (a command id no job accepts), retried once."""
    queue = command_queue(redis, os.environ["FLEET_QUEUE"])
    job_id = batch_job_id(queue.name, ["bad id"])
    queue.enqueue_call(DECIDE_JOB, args=(["bad id"],), job_id=job_id,
                       retry=Retry(max=1, interval=[1]))
    return job_id


def test_a_burst_drain_delivers_retries_and_names_the_jobs_that_failed_for_good(
        real_redis: Redis) -> None:
    job_id = failing_job(real_redis)
    drained = drain(real_redis, [os.environ["FLEET_QUEUE"]])
    assert (drained.stopped, drained.failed_job_ids) == (False, [job_id])


def test_a_burst_worker_whose_job_failed_for_good_exits_3(
        sqlite_url: str, real_redis: Redis) -> None:
    open_store(sqlite_url).engine.dispose()
    failing_job(real_redis)
    exit_code, stderr = burst(sqlite_url)
    assert exit_code == 3, stderr
    assert stderr.splitlines()[-1].startswith("error: 1 job(s) failed after every retry")


def test_follow_up_commands_go_to_the_queue_their_job_came_from(
        sqlite_url: str, real_redis: Redis) -> None:
    """A scale-up's placements, issued by a job on `other`, are decided by the worker serving
    `other`: they had gone to FLEET_QUEUE, which nobody served."""
    store = open_store(sqlite_url)
    ids = accept(store, [command_adapter.validate_python(p) for p in
                         [*fleet("r1"), observe("spike", 10, arrival=250.0)]])
    with other_queue(real_redis) as other:
        enqueue_commands(real_redis, Settings(queues=(other,)), ids)
        exit_code, stderr = burst(sqlite_url, "--queues", other)
    assert exit_code == 0, stderr
    issued = [e.command_id for e in store.read_all() if e.event_type == "CommandAccepted"
              and e.command_id and e.command_id.startswith("spike:place:")]
    assert len(issued) == 2  # demand 3 replicas, one ready
    assert pending_command_ids(store) == []
    store.engine.dispose()


def test_a_worker_serving_other_queues_reconciles_onto_them(
        sqlite_url: str, real_redis: Redis) -> None:
    store = open_store(sqlite_url)
    accept(store, [command_adapter.validate_python(assess_memory(f"b{i}")) for i in range(3)])
    with other_queue(real_redis) as other:
        exit_code, stderr = burst(sqlite_url, "--queues", other)
    assert exit_code == 0, stderr
    assert pending_command_ids(store) == []  # reconciled onto `other`, and decided there
    assert command_queue(real_redis, os.environ["FLEET_QUEUE"]).count == 0
    store.engine.dispose()


def test_a_reconcile_leaves_a_batch_whose_job_is_still_queued(
        sqlite_url: str, real_redis: Redis) -> None:
    # Every worker start reconciles: with a backlog queued, each had enqueued all of it again
    # (20,000 commands, 4 processes: 100,000 redundant deliveries).
    store = open_store(sqlite_url)
    settings = Settings(database_url=sqlite_url, redis_url=os.environ["FLEET_REDIS_URL"],
                        batch_size=2, queues=(os.environ["FLEET_QUEUE"],))
    ids = accept(store, [command_adapter.validate_python(assess_memory(f"q{i}"))
                         for i in range(5)])
    queue = command_queue(real_redis, settings.command_queue)
    enqueue_commands(real_redis, settings, ids[:4])  # two full batches queued; q4's job lost
    assert reconcile(settings, store).accepted_ids == ["q4"]
    assert queue.count == 3
    queue.empty()
    assert reconcile(settings, store).accepted_ids == ids
    store.engine.dispose()


def test_a_reconcile_re_enqueues_at_once_the_batch_of_a_worker_killed_on_this_machine(
        sqlite_url: str, real_redis: Redis, processes: list[subprocess.Popen[str]]) -> None:
    # RQ counts the job as started until its heartbeat lapses (a minute or more): `reconcile`
    # had re-enqueued nothing, and `worker --burst` exited 0, its commands undecided.
    store = open_store(sqlite_url)
    settings = Settings(database_url=sqlite_url, redis_url=os.environ["FLEET_REDIS_URL"],
                        queues=(os.environ["FLEET_QUEUE"],))
    worker = start_fleetctl("worker", env=worker_env(sqlite_url))
    processes.append(worker)
    queue = command_queue(real_redis, settings.command_queue)
    wait_until(lambda: bool(Worker.all(queue=queue)), 60, "the worker to serve")
    ids = accept(store, [command_adapter.validate_python(assess_memory(f"k{i}"))
                         for i in range(3)])
    started = StartedJobRegistry(queue=queue)
    with store.transaction():  # the job cannot append: it waits for this lock
        enqueue_commands(real_redis, settings, ids)
        wait_until(lambda: started.count == 1, 60, "the job to start")
        kill_process_tree(worker.pid)
        worker.communicate()
    assert started.get_job_ids() == [batch_job_id(queue.name, ids)]  # RQ still counts it
    assert reconcile(settings, store).accepted_ids == ids
    assert burst(sqlite_url)[0] == 0
    assert pending_command_ids(store) == []
    store.engine.dispose()
