"""Start workers: forking RQ workers on a real Redis, or in-process ones on the embedded fake."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import structlog
from fakeredis import TcpFakeServer
from redis import Redis
from rq import SimpleWorker, Worker
from rq.serializers import JSONSerializer

from controlplane.runtime import collect_garbage_less_often
from controlplane.settings import Settings
from workers.queue import command_queue

log = structlog.get_logger(__name__)


class _ToleratesEmbeddedRedis:
    """The embedded fake Redis answers CLIENT INFO in a shape redis-py cannot parse."""

    def _set_ip_address(self, connection: Redis) -> None:
        try:
            super()._set_ip_address(connection)  # type: ignore[misc]
        except ValueError:
            self.ip_address = "unknown"


class FleetWorker(_ToleratesEmbeddedRedis, Worker):
    """A forking RQ worker: each job runs in a child the worker outlives."""


class FleetSimpleWorker(_ToleratesEmbeddedRedis, SimpleWorker):
    """An in-process RQ worker, for the embedded fake Redis."""


def work(connection: Redis, queues: Sequence[str], burst: bool, forking: bool,
         max_jobs: int | None = None) -> bool:
    """Run one worker until the queues are empty (burst) or forever; True if it did any job.

    Forking workers run each job in a child process, so a job killed mid-batch never takes the
    worker with it; the in-process worker serves the embedded fake Redis, which is per process.
    """
    collect_garbage_less_often()
    worker_class: type[Worker] | type[SimpleWorker] = FleetWorker if forking else FleetSimpleWorker
    worker = worker_class([command_queue(connection, name) for name in queues],
                          connection=connection, serializer=JSONSerializer)
    return bool(worker.work(burst=burst, max_jobs=max_jobs, logging_level="WARNING"))


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


def advertise(settings: Settings, url: str) -> Path | None:
    """Write the up-file beside the database so `fleetctl submit` finds this server."""
    path = settings.up_file
    if path is not None:
        path.write_text(json.dumps({"redis_url": url, "pid": os.getpid()}))
    return path


def spawn_worker_processes(count: int, redis_url: str, queues: Sequence[str]) \
        -> list[subprocess.Popen[bytes]]:
    """Start `count` `fleetctl worker` processes (forking RQ workers) against `redis_url`."""
    env = {**os.environ, "FLEET_REDIS_URL": redis_url}
    args = [sys.executable, "-m", "controlplane.cli.main", "worker"]
    for name in queues:
        args += ["--queues", name]
    return [subprocess.Popen(args, env=env) for _ in range(count)]
