"""A fleet under test: its log, its Redis queue, forking `fleetctl worker` processes, and the
loop that drives commands through them while faults are injected.

Every process and server here is the harness's own and is stopped by its process id.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from redis import Redis
from redis.exceptions import RedisError
from rq import Worker
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from controlplane.commands import command_adapter
from controlplane.decisions import ACCEPTED
from controlplane.runtime import open_store
from controlplane.service import accept, pending_command_ids
from controlplane.settings import Settings
from events.tables import events_table
from workers.processes import kill_process_tree
from workers.queue import command_queue, enqueue_commands
from workers.runner import free_loopback_port

STALL_SECONDS = 2.0
WORKER_START_SECONDS = 3.0  # a new worker imports, registers and reconciles before deciding
POLL_SECONDS = 0.04
SETTLE_TIMEOUT_SECONDS = 120.0
Payload = dict[str, Any]


class FaultSetupError(RuntimeError):
    """The harness cannot build what a fault needs (a missing binary, a server that never starts)."""


@dataclass(frozen=True)
class FaultTarget:
    """Where a run happens: its database, its Redis and queue, and a scratch directory for logs."""

    database_url: str
    redis_url: str
    queue: str
    scratch: Path
    batch_size: int = 20


@dataclass
class Tally:
    """What a run did to the fleet, counted as it happened."""

    faults_injected: int = 0
    duplicates_delivered: int = 0
    reconciles: int = 0
    workers_started: int = 0
    workers_killed: int = 0
    notes: list[str] = field(default_factory=list)


class RedisServer:
    """A private `redis-server` on a loopback port without persistence: a kill loses the queue."""

    def __init__(self, scratch: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FaultSetupError("redis-server is not on PATH; the Redis-restart fault needs it "
                                  "(apt-get install redis-server)")
        self.binary, self.scratch = binary, scratch
        self.port = free_loopback_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server empty and wait until it answers."""
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", str(self.scratch)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                Redis.from_url(self.url, socket_connect_timeout=0.2).ping()
                return
            except RedisError:
                time.sleep(0.05)
        self.kill()
        raise FaultSetupError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        """SIGKILL the server: everything it held (queues, registries, jobs) is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


class Fleet:
    """The fleet under test, seen from outside: submit, watch the log, start and kill workers."""

    def __init__(self, target: FaultTarget, worker_count: int) -> None:
        self.target, self.worker_count = target, worker_count
        self.store = open_store(target.database_url)
        self.settings = Settings(database_url=target.database_url, redis_url=target.redis_url,
                                 batch_size=target.batch_size, queues=(target.queue,))
        self.redis = Redis.from_url(target.redis_url, socket_connect_timeout=2, socket_timeout=10)
        self.application_name = f"fleet-fault-{uuid.uuid4().hex[:10]}"
        self.workers: list[subprocess.Popen[bytes]] = []
        self.batches: list[list[str]] = []
        self.accepted: list[str] = []
        self.tally = Tally()
        self.redis_server: RedisServer | None = None
        self.last_worker_start = 0.0
        target.scratch.mkdir(parents=True, exist_ok=True)
        self.worker_log: BinaryIO = (target.scratch / "workers.log").open("ab")

    @property
    def is_sqlite(self) -> bool:
        return self.target.database_url.startswith("sqlite")

    def worker_database_url(self) -> str:
        """PostgreSQL connections of workers carry an application name the faults can select."""
        if self.is_sqlite:
            return self.target.database_url
        url = make_url(self.target.database_url).update_query_dict(
            {"application_name": self.application_name})
        return url.render_as_string(hide_password=False)

    def start_worker(self) -> None:
        """Start one `fleetctl worker` (it reconciles first) in its own process group."""
        env = {**os.environ, "FLEET_DATABASE_URL": self.worker_database_url(),
               "FLEET_REDIS_URL": self.target.redis_url, "FLEET_QUEUE": self.target.queue,
               "FLEET_BATCH_SIZE": str(self.target.batch_size)}
        self.workers.append(subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli.main", "worker"], env=env,
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=self.worker_log))
        self.tally.workers_started += 1
        self.last_worker_start = time.monotonic()

    def kill_worker(self, worker: subprocess.Popen[bytes]) -> None:
        """SIGKILL a worker and its work horse (`kill_process_tree`)."""
        self.workers.remove(worker)
        kill_process_tree(worker.pid)
        worker.wait(timeout=10)
        self.tally.workers_killed += 1

    def replace_dead_workers(self) -> None:
        """Workers that exited on their own (a lost Redis) are noted and replaced."""
        for worker in [w for w in self.workers if w.poll() is not None]:
            self.workers.remove(worker)
            self.tally.notes.append(f"worker {worker.pid} exited with {worker.returncode}")
        while len(self.workers) < self.worker_count:
            self.start_worker()

    def busy_worker(self, timeout_seconds: float) -> tuple[subprocess.Popen[bytes], str] | None:
        """One of our workers while it runs a job, with the job's id; None if none was seen busy."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            try:
                busy = {w.pid: w.get_current_job_id()
                        for w in Worker.all(queue=command_queue(self.redis, self.target.queue))
                        if w.get_state() == "busy"}
            except RedisError:
                busy = {}
            for worker in self.workers:
                job_id = busy.get(worker.pid)
                if job_id is not None and worker.poll() is None and self._running(job_id):
                    return worker, job_id
            time.sleep(0.01)
        return None

    def _running(self, job_id: str) -> bool:
        """The job is still running (a busy worker may have just finished it)."""
        try:
            job = Job.fetch(job_id, connection=self.redis, serializer=JSONSerializer)
            return bool(job.get_status() == JobStatus.STARTED)
        except (NoSuchJobError, RedisError):
            return False

    def enqueue(self, command_ids: Sequence[str], settings: Settings | None = None) -> None:
        """Enqueue ids in batches; a Redis that is down loses them (the inbox keeps them)."""
        settings = settings or self.settings
        try:
            enqueue_commands(self.redis, settings, list(command_ids))
        except RedisError as error:
            self.tally.notes.append(f"enqueue failed: {type(error).__name__}")

    def submit(self, payloads: Sequence[Payload]) -> list[str]:
        """Accept commands into the inbox, then enqueue them: what `fleetctl submit` does."""
        accepted = accept(self.store, [command_adapter.validate_python(p) for p in payloads])
        self.accepted += accepted
        for start in range(0, len(accepted), self.target.batch_size):
            self.batches.append(accepted[start:start + self.target.batch_size])
        self.enqueue(accepted)
        return accepted

    def reconcile(self) -> None:
        """Re-enqueue every accepted command without a decision: what `fleetctl reconcile` does."""
        self.enqueue(pending_command_ids(self.store))
        self.tally.reconciles += 1

    def decided_count(self) -> int:
        """Commands with a decision in the log."""
        query = select(func.count(func.distinct(events_table.c.command_id))).where(
            events_table.c.event_type != ACCEPTED, events_table.c.command_id.is_not(None))
        with self.store.engine.connect() as conn:
            return int(conn.execute(query).scalar() or 0)

    def settle(self, due: Callable[[int], None], timeout_seconds: float = SETTLE_TIMEOUT_SECONDS) \
            -> bool:
        """Run until every accepted command is decided, calling `due(decided)` as it goes.

        A lost queue or a failed job stalls progress; after STALL_SECONDS without a new decision
        (and no worker starting, which reconciles by itself) the pending commands are reconciled.
        Workers that died are replaced. False on timeout.
        """
        deadline = time.monotonic() + timeout_seconds
        last_count, last_change = -1, time.monotonic()
        while time.monotonic() < deadline:
            count = self.decided_count()
            injected_before = self.tally.faults_injected
            due(count)
            if self.tally.faults_injected != injected_before or count != last_count:
                last_count, last_change = count, time.monotonic()
            if not pending_command_ids(self.store):
                return True
            self.replace_dead_workers()
            quiet_since = max(last_change, self.last_worker_start + WORKER_START_SECONDS)
            if time.monotonic() - quiet_since > STALL_SECONDS:
                self.reconcile()
                last_change = time.monotonic()
            time.sleep(POLL_SECONDS)
        return False

    def drain(self, timeout_seconds: float = 30.0) -> None:
        """Let redundant deliveries still queued run (each must append nothing) before checking."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            try:
                if (command_queue(self.redis, self.target.queue).count == 0
                        and self.busy_worker(0.05) is None):
                    return
            except RedisError:
                return
            self.replace_dead_workers()
            time.sleep(0.05)
        self.tally.notes.append("queue not drained before the check")

    def stop(self) -> None:
        """Warm-stop every worker (SIGTERM), then SIGKILL the group of any that lingers."""
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                kill_process_tree(worker.pid)
                worker.wait(timeout=10)
        self.workers = []
        self.worker_log.close()
        self.redis.close()
