"""Long-running `fleetctl worker` processes for the benchmarks that go through real Redis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from redis import Redis
from rq import Worker

from bench.common import ROOT

WORKER_READY_TIMEOUT_SECONDS = 60.0
WORKER_STOP_TIMEOUT_SECONDS = 30.0
# Workers write a batch's log line after its commit: how long to wait for the last ones.
LOG_LINES_TIMEOUT_SECONDS = 10.0


class WorkerPool:
    """Long-running `fleetctl worker` processes (forking RQ workers) on one database and Redis.

    The pool only grows, and every worker is registered and idle before a run's clock starts, so
    start-up (imports, reconcile) is never timed. Workers are stopped with SIGTERM (RQ's warm
    shutdown) by process id, then killed if they linger.
    """

    def __init__(self, env: dict[str, str], log_path: Path, connection: Redis) -> None:
        self.env, self.log_path, self.connection = env, log_path, connection
        self.processes: list[subprocess.Popen[bytes]] = []

    def grow_to(self, count: int) -> None:
        args = [sys.executable, "-m", "controlplane.cli.main", "worker"]
        with self.log_path.open("ab") as log_file:
            while len(self.processes) < count:
                self.processes.append(subprocess.Popen(
                    args, cwd=ROOT, env={**os.environ, **self.env}, stdout=log_file,
                    stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + WORKER_READY_TIMEOUT_SECONDS
        while Worker.count(connection=self.connection) < count:
            if any(p.poll() is not None for p in self.processes) or time.monotonic() > deadline:
                raise RuntimeError(f"workers did not start; their log ends:\n{tail(self.log_path)}")
            time.sleep(0.02)

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def lock_held_seconds(self, since: int, decisions: int) -> float | None:
        """Seconds the workers' batches held the append lock, from their `batch_decided` lines
        written after byte `since` of their log; None without them (workers below INFO).

        A batch writes its line after its commit, so this waits (a few seconds at most) until
        the lines account for `decisions` commands. A line cut short or interleaved with
        another worker's is skipped.
        """
        deadline = time.monotonic() + LOG_LINES_TIMEOUT_SECONDS
        while True:
            batches = self._batch_lines(since)
            decided = sum(b.get("decided_now", 0) + b.get("already_decided", 0) for b in batches)
            if decided >= decisions or time.monotonic() > deadline:
                held = [b["lock_held_ms"] for b in batches if "lock_held_ms" in b]
                return sum(held) / 1000 if held else None
            time.sleep(0.1)

    def _batch_lines(self, since: int) -> list[dict[str, Any]]:
        with self.log_path.open("rb") as log_file:
            log_file.seek(since)
            lines = [line for line in log_file
                     if line.startswith(b"{") and line.endswith(b"\n") and b'"batch_decided"' in line]
        found = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == "batch_decided":
                found.append(record)
        return found

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        stop_processes(self.processes)


def stop_processes(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """Warm-stop each process by its id; kill its own process group if it outlives the timeout."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=WORKER_STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # its own session: the worker and its horse
            process.wait()


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
