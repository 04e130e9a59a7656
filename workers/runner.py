"""Start workers: forking RQ workers on a real Redis, or in-process ones on the embedded fake."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from fakeredis import TcpFakeServer
from redis import Redis
from redis.client import Pipeline
from redis.exceptions import RedisError
from rq import Queue, SimpleWorker, Worker
from rq.exceptions import StopRequested
from rq.job import Job
from rq.registry import FailedJobRegistry, ScheduledJobRegistry
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer
from rq.worker import WorkerStatus
from sqlalchemy.exc import SQLAlchemyError

from controlplane.errors import OperationalError
from controlplane.runtime import collect_garbage_less_often
from controlplane.settings import Settings, redacted_url
from workers.claims import QueueClaim
from workers.connections import advertised_up_url, connect_to_up
from workers.outage import LostQueueWatch, mark_queue
from workers.queue import command_queue, disarm, job_problem
from workers.stranded import Inbox, StrandedCommandsWatch

log = structlog.get_logger(__name__)
# A retried job whose back-off has ended is put back on its queue within about this long.
RETRY_POLL_SECONDS = 1.0
# An idle worker wakes this often (RQ's default is 405 s) to put due retries back.
IDLE_WAKE_SECONDS = 1
# After a failed delivery, the next attempt waits this long.
RETRY_FAILED_SECONDS = 30.0
# A worker that lost Redis tries it again after this long, doubling up to the maximum.
RECONNECT_FIRST_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 30.0
# A worker that served this long before quitting starts its next wait from the first delay.
STABLE_SECONDS = 60.0
# Set by a supervisor (`workers.supervision`) to its pid in the worker processes it starts: a
# worker whose parent is no longer that process stops (`orphaned`).
SUPERVISOR_ENV = "FLEET_SUPERVISOR_PID"


def orphaned() -> bool:
    """True in a supervised worker whose supervisor is gone (killed with SIGKILL, it could not
    stop its workers): such a worker would serve on, unwatched, forever."""
    supervisor = os.environ.get(SUPERVISOR_ENV)
    return supervisor is not None and str(os.getppid()) != supervisor


def watch_supervisor(poll_seconds: float = 1.0) -> None:
    """In a supervised worker, send this process SIGTERM (RQ's warm shutdown: the job in hand
    may finish) once its supervisor is gone. A thread, since the worker may be anywhere then:
    in a job, or in RQ's own loop retrying a Redis that went with the supervisor."""
    if os.environ.get(SUPERVISOR_ENV) is None:
        return

    def watch() -> None:
        while not orphaned():
            time.sleep(poll_seconds)
        log.warning("supervisor_gone", parent_pid=os.getppid())
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


class UpFollower:
    """For a `fleetctl worker` that found its Redis through `up`'s up-file: a thread that notices
    when the file names a new `up` of this database (the one it served stopped, another
    started, on another port), so the worker serves that one.

    It polls the file every `poll_seconds`; only when the file names another URL than the one
    `connect` reached does it ask that Redis which database it serves (`advertised_up_url`),
    then sets `moved`. The worker's next heartbeat while idle (at least once a second, even
    while RQ retries the lost Redis) ends RQ's loop, and `serve` connects again through the
    file; a job in hand is finished first. No signal is sent: the worker's own stop signals
    keep their meaning.
    """

    def __init__(self, settings: Settings, url: str, poll_seconds: float = 1.0) -> None:
        self.settings, self.url, self.poll_seconds = settings, url, poll_seconds
        self.moved = threading.Event()

    def connect(self) -> Redis:
        """A connection to the `up` the file names now (`connect_to_up`), followed from then on
        (a move noticed before it is taken by it)."""
        self.url, connection = connect_to_up(self.settings)
        self.moved.clear()
        return connection

    def start(self) -> UpFollower:
        threading.Thread(target=self._follow, name="up-follower", daemon=True).start()
        return self

    def _follow(self) -> None:
        while True:
            time.sleep(self.poll_seconds)
            if self.moved.is_set() or self._named() in (None, self.url):
                continue
            url = advertised_up_url(self.settings)
            if url is not None and url != self.url:
                log.warning("up_moved", redis_url=redacted_url(url))
                self.moved.set()

    def _named(self) -> str | None:
        """The URL the up-file names, unchecked; None when there is none to read."""
        assert self.settings.up_file is not None
        try:
            return str(json.loads(self.settings.up_file.read_text())["redis_url"])
        except (OSError, ValueError, KeyError, TypeError):
            return None


class _ToleratesEmbeddedRedis:
    """The embedded fake Redis answers CLIENT INFO in a shape redis-py cannot parse."""

    def _set_ip_address(self, connection: Redis) -> None:
        try:
            super()._set_ip_address(connection)  # type: ignore[misc]
        except ValueError:
            self.ip_address = "unknown"


class _RunsOnlyDecideJobs:
    """Refuses any job `enqueue_commands` did not make (`workers.queue.job_problem`): it is
    disarmed, so it fails at once with its reason, running nothing it named."""

    def perform_job(self, job: Job, queue: Queue, execution: Any) -> bool:
        problem = job_problem(job)
        if problem is not None:
            log.error("job_refused", job_id=job.id, reason=problem)
            disarm(job, problem)
        return bool(super().perform_job(job, queue, execution))  # type: ignore[misc]


class FleetWorker(_RunsOnlyDecideJobs, _ToleratesEmbeddedRedis, Worker):
    """A forking RQ worker: each job runs in a child the worker outlives.

    It also delivers retries. RQ parks a job that failed (or whose work horse died) in the
    queue's ScheduledJobRegistry until its back-off ends, and only a scheduler puts it back on
    the queue; RQ's own scheduler is another process, which would outlive a killed worker. So
    each worker, from its heartbeat and at most once per RETRY_POLL_SECONDS, takes RQ's
    scheduler lock for its queues (one worker at a time does it), enqueues the due jobs and
    lets the lock go; an idle worker wakes every IDLE_WAKE_SECONDS for it. A failure there (a
    retry entry RQ itself cannot read back) is logged and tried again after RETRY_FAILED_SECONDS:
    it never takes the worker down. A worker killed while holding that lock holds up retries for
    at most RQ's lock lifetime (about a minute); `reconcile` recovers their commands regardless.

    From the same heartbeat it notices a Redis that came back empty (`LostQueueWatch`) and
    calls `on_queue_lost` (the CLI reconciles the inbox), then registers itself again; and
    enqueues again commands of `inbox` that no job will decide (`StrandedCommandsWatch`).
    """

    def __init__(self, *args: Any, on_queue_lost: Callable[[], object] | None = None,
                 inbox: Inbox | None = None, stop_when: Callable[[], bool] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stop_when = stop_when
        self._retries_checked_at = 0.0
        self._owner_pid = os.getpid()
        self._retry_scheduler: RQScheduler | None = None
        self._lost_queue = LostQueueWatch(self.connection, self.queues[0].name, self.name,
                                          on_queue_lost)
        self._stranded = StrandedCommandsWatch(self.connection, self.queues, inbox)
        self._claim = QueueClaim(self.connection, [queue.name for queue in self.queues],
                                 inbox.log_id if inbox is not None else None)

    @property
    def dequeue_timeout(self) -> int:
        return min(super().dequeue_timeout, IDLE_WAKE_SECONDS)

    @property
    def connection_timeout(self) -> int:
        # RQ sizes the Redis socket timeout from the dequeue timeout; keep RQ's own (minutes),
        # so a Redis stall longer than the short idle wake does not fail jobs or the worker.
        return int(super().dequeue_timeout) + 10

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        # Idle (RQ's dequeue loop beats before each wait, and while it retries a lost Redis),
        # the loop ends here when asked (`UpFollower`); never in a job's bookkeeping.
        if (self._stop_when is not None and pipeline is None
                and self.get_state() == WorkerStatus.IDLE and self._stop_when()):
            raise StopRequested()
        super().heartbeat(timeout, pipeline)
        # Not inside RQ's pipelines, and never in a work horse (a fork of this worker).
        if pipeline is None and os.getpid() == self._owner_pid:
            self.deliver_due_retries()
            if self._lost_queue.check():
                self._register_again()
            self._stranded.check()
            self._claim.renew()

    def _register_again(self) -> None:
        """Redis lost this worker's registration with the queue: appear in `rq info` again."""
        try:
            # Only what the heartbeats wrote since is left of this worker's hash: start afresh.
            self.connection.delete(self.key)
            self.register_birth()  # type: ignore[no-untyped-call]
        except (ValueError, RedisError) as error:  # Redis went again, or a twin registered
            log.warning("worker_registration_failed", error=f"{type(error).__name__}: {error}")

    def deliver_due_retries(self, now: bool = False) -> None:
        """Put jobs whose retry back-off has ended back on their queues (at most once per
        RETRY_POLL_SECONDS, unless `now`)."""
        clock = time.monotonic()
        if not now and clock - self._retries_checked_at < RETRY_POLL_SECONDS:
            return
        self._retries_checked_at = clock
        if self._retry_scheduler is None:
            self._retry_scheduler = RQScheduler(self.queues, connection=self.connection,
                                                serializer=self.serializer,
                                                logging_level=logging.WARNING)
        scheduler = self._retry_scheduler
        try:
            if scheduler.acquire_locks():  # type: ignore[no-untyped-call]
                try:
                    scheduler.enqueue_scheduled_jobs()  # type: ignore[no-untyped-call]
                finally:
                    scheduler.release_locks()  # type: ignore[no-untyped-call]
        except Exception as error:  # never out of a heartbeat: RQ would stop the worker
            log.warning("retry_delivery_failed", error=f"{type(error).__name__}: {error}")
            self._retries_checked_at = clock + RETRY_FAILED_SECONDS - RETRY_POLL_SECONDS


class FleetSimpleWorker(_RunsOnlyDecideJobs, _ToleratesEmbeddedRedis, SimpleWorker):
    """An in-process RQ worker, for the embedded fake Redis. `stop_when`, if set, is asked after
    each job; when it answers yes the worker stops before the next one."""

    stop_when: Callable[[], bool] | None = None
    # Each job that failed here, as its exception's type and first line (None: not collected).
    failures: list[str] | None = None

    def execute_job(self, job: Job, queue: Queue) -> None:
        super().execute_job(job, queue)
        if self.stop_when is not None and self.stop_when():
            self._stop_requested = True  # what RQ's loop checks between jobs

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        if self.failures is not None:
            kind, error = exc_info[0], exc_info[1]
            # The first line of the message: SQLAlchemy's carry the SQL and a link after it.
            message = str(error).strip().splitlines()[0] if str(error).strip() else ""
            self.failures.append(f"{getattr(kind, '__name__', 'error')}: {message}"
                                 if message else getattr(kind, "__name__", "the job failed"))
        super().handle_exception(job, *exc_info)


def work(connection: Redis, queues: Sequence[str], burst: bool, forking: bool,
         max_jobs: int | None = None, stop_when: Callable[[], bool] | None = None,
         failures: list[str] | None = None) -> bool:
    """Run one worker until the queues are empty (burst) or forever; True if it did any job.

    Forking workers run each job in a child process, so a job killed mid-batch never takes the
    worker with it; the in-process worker serves the embedded fake Redis, which is per process,
    and appends to `failures`, when given, each failed job's exception (type, first line).
    """
    worker = _worker(connection, queues, forking)
    if isinstance(worker, FleetSimpleWorker):
        worker.stop_when, worker.failures = stop_when, failures
    return bool(worker.work(burst=burst, max_jobs=max_jobs, logging_level="WARNING"))


@dataclass(frozen=True)
class Drained:
    """How a burst run ended: `stopped` by SIGTERM or SIGINT before the queues were empty,
    and the ids of the jobs that failed for good during it (their commands undecided)."""

    stopped: bool
    failed_job_ids: list[str]


def drain(connection: Redis, queues: Sequence[str]) -> Drained:
    """Run forking workers until the queues are empty and no job waits for a retry.

    RQ's burst worker stops once the queues are empty, leaving a job that failed parked for
    its retry's back-off: it exited as if done, the job's commands undecided. Here each due
    retry is delivered and worked too; a job out of retries is reported as failed. SIGTERM or
    SIGINT stop it (RQ's warm shutdown: the job in hand is finished, the rest left queued).
    """
    queue_objects = [command_queue(connection, name) for name in queues]
    failed_before = {job_id for queue in queue_objects
                     for job_id in FailedJobRegistry(queue=queue).get_job_ids()}
    while True:
        worker = _forking_worker(connection, queues)
        try:
            worker.work(burst=True, logging_level="WARNING")
        except StopRequested:  # a signal between RQ's loop and its teardown
            return Drained(True, [])
        finally:  # RQ's handlers would raise StopRequested from wherever this process is next
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if worker._shutdown_requested_date is not None:  # RQ's mark of a warm shutdown
            return Drained(True, [])
        if not _retries_waiting(worker, queue_objects):
            break
    failed = [job_id for queue in queue_objects
              for job_id in FailedJobRegistry(queue=queue).get_job_ids()
              if job_id not in failed_before]
    return Drained(False, failed)


def _retries_waiting(worker: FleetWorker, queues: Sequence[Queue]) -> bool:
    """Whether a job waits for a retry: wait until one is due and deliver it (True), or False."""
    while any(ScheduledJobRegistry(queue=queue).count  # type: ignore[no-untyped-call]
              for queue in queues):
        time.sleep(RETRY_POLL_SECONDS)
        worker.deliver_due_retries(now=True)
        if any(queue.count for queue in queues):
            return True
    return False


def _worker(connection: Redis, queues: Sequence[str], forking: bool,
            on_queue_lost: Callable[[], object] | None = None,
            inbox: Inbox | None = None,
            stop_when: Callable[[], bool] | None = None) -> Worker | SimpleWorker:
    if forking:
        return _forking_worker(connection, queues, on_queue_lost, inbox, stop_when)
    collect_garbage_less_often()
    queue_objects = [command_queue(connection, name) for name in queues]
    return FleetSimpleWorker(queue_objects, connection=connection, serializer=JSONSerializer)


def _forking_worker(connection: Redis, queues: Sequence[str],
                    on_queue_lost: Callable[[], object] | None = None,
                    inbox: Inbox | None = None,
                    stop_when: Callable[[], bool] | None = None) -> FleetWorker:
    collect_garbage_less_often()
    return FleetWorker([command_queue(connection, name) for name in queues],
                       connection=connection, serializer=JSONSerializer,
                       on_queue_lost=on_queue_lost, inbox=inbox, stop_when=stop_when)


def serve(connect: Callable[[], Redis], queues: Sequence[str],
          on_reconnect: Callable[[], object], inbox: Inbox | None = None,
          follower: UpFollower | None = None) -> None:
    """Run a forking worker until it is asked to stop, outliving a Redis that goes away.

    RQ's worker rides out a Redis outage in its dequeue loop, but quits when Redis fails
    anywhere else (a heartbeat, its maintenance, a job's bookkeeping), as it does on any error
    it does not expect (it logs it and returns). Unless it was asked to stop (SIGTERM or
    SIGINT: RQ's warm shutdown), this waits until Redis answers, marks the queue
    (`workers.outage`), calls `on_reconnect` (the caller reconciles the inbox: Redis may be back
    empty) and serves again with a new worker. The wait starts at RECONNECT_FIRST_SECONDS and
    doubles up to RECONNECT_MAX_SECONDS while the worker keeps quitting within STABLE_SECONDS
    of starting, so a fault that persists costs a restart and a reconcile every
    RECONNECT_MAX_SECONDS, never a busy loop. While it waits no job is in hand: SIGTERM exits
    at once (through the caller's clean-up), SIGINT raises KeyboardInterrupt.

    With a `follower` (a worker attached to `up` through its up-file), a new `up` of this
    database serving elsewhere ends the worker's loop too: it connects again, through the file,
    to the new `up` and serves there.
    """
    watch_supervisor()
    if follower is not None:
        follower.start()
    connection = connect()
    mark_queue(connection, queues[0])
    delay = RECONNECT_FIRST_SECONDS
    while True:
        worker = _worker(connection, queues, forking=True, on_queue_lost=on_reconnect,
                         inbox=inbox, stop_when=None if follower is None else follower.moved.is_set)
        started = time.monotonic()
        try:
            worker.work(burst=False, logging_level="WARNING")
        except RedisError as error:  # RQ's teardown, on the connection that failed
            log.warning("worker_lost_redis", error=f"{type(error).__name__}: {error}")
        except StopRequested:  # a signal between RQ's loop and its teardown
            return
        finally:
            _stop_listening(worker)
        if worker._shutdown_requested_date is not None:  # RQ's mark of a warm shutdown
            return
        if follower is not None and follower.moved.is_set():
            follower.moved.clear()
            delay = RECONNECT_FIRST_SECONDS
        else:
            served = time.monotonic() - started
            log.error("worker_stopped_unexpectedly", served_seconds=round(served, 1))
            if served > STABLE_SECONDS:
                delay = RECONNECT_FIRST_SECONDS
        signal.signal(signal.SIGTERM, _exit_now)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        connection, delay = _reconnected(connect, queues[0], on_reconnect, delay)


def _stop_listening(worker: Worker | SimpleWorker) -> None:
    """Stop the thread RQ listens for its commands in: RQ's teardown stops it only after
    recording the worker's death, which fails on a lost Redis, and the thread then retried that
    Redis (logging each failure) for as long as the process lived, one more per reconnect."""
    if worker.pubsub_thread is not None:
        worker.pubsub_thread.stop()


def _exit_now(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _reconnected(connect: Callable[[], Redis], queue_name: str,
                 on_reconnect: Callable[[], object], delay: float) -> tuple[Redis, float]:
    """A connection once Redis answers and the inbox is reconciled; and the next delay."""
    while True:
        log.warning("waiting_for_redis", retry_in_seconds=delay)
        time.sleep(delay)
        delay = min(delay * 2, RECONNECT_MAX_SECONDS)
        try:
            connection = connect()  # it pings
            mark_queue(connection, queue_name)
            on_reconnect()
        except (RedisError, OperationalError, SQLAlchemyError) as error:  # Redis or the database
            log.warning("reconnect_failed", error=f"{type(error).__name__}: {error}")
            continue
        log.warning("serving_again")
        return connection, delay


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class EmbeddedRedisServer:
    """The embedded fake Redis served on a loopback port, so other processes can reach it."""

    def __init__(self, port: int = 0) -> None:
        self.port = port or free_loopback_port()
        self.server = TcpFakeServer(("127.0.0.1", self.port), server_type="redis")
        # A connection thread may outlive its client; it must never hold `up` open at exit.
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> EmbeddedRedisServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
