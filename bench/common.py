"""What the benchmarks share: scratch databases and Redis, worker processes, and the result table.

Every resource here is the benchmark's own and is removed on exit: a temporary directory for
SQLite files, a `fleet_bench_<random>` PostgreSQL database (dropped after), a Redis db index
(flushed before and after), and worker processes (stopped by their process ids).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis import Redis
from rq import Worker
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
WORKER_READY_TIMEOUT_SECONDS = 60.0
WORKER_STOP_TIMEOUT_SECONDS = 30.0


class BenchSkipped(Exception):
    """A server a scenario needs is unreachable; the scenario is reported as skipped."""


@dataclass(frozen=True)
class Measurement:
    """One timed run: `commands` decided end to end in `seconds` on `store` with `workers`."""

    path: str
    store: str
    workers: str
    commands: int
    seconds: float
    note: str = ""

    @property
    def per_second(self) -> float:
        return self.commands / self.seconds if self.seconds > 0 else 0.0


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = []
    for row in (headers, *rows):
        cells = [str(cell).ljust(width) if index == 0 else str(cell).rjust(width)
                 for index, (cell, width) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


@contextmanager
def redis_db(url: str) -> Iterator[Redis]:
    """The Redis db at `url`, flushed before and after; BenchSkipped when unreachable."""
    connection = Redis.from_url(url, socket_connect_timeout=2)
    try:
        connection.ping()
    except Exception as error:  # redis raises several unrelated types for "unreachable"
        raise BenchSkipped(f"Redis at {url} is unreachable ({error.__class__.__name__})") from None
    connection.flushdb()
    try:
        yield connection
    finally:
        connection.flushdb()
        connection.close()


@contextmanager
def postgres_database(admin_url: str) -> Iterator[str]:
    """A `fleet_bench_<random>` database created on `admin_url`'s server and dropped after."""
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"fleet_bench_{secrets.token_hex(4)}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as error:
        admin.dispose()
        raise BenchSkipped(f"PostgreSQL is unreachable ({error.__class__.__name__})") from None
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def log_position(engine: Engine) -> int:
    """The log's head position: how many events are stored."""
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT position FROM log_head WHERE id = 1")).scalar() or 0)


def wait_for_decisions(engine: Engine, accepted_type: str, commands: int, timeout_seconds: float,
                       workers: Sequence[subprocess.Popen[bytes]] = ()) -> float:
    """Poll until `commands` decisions are stored; returns the monotonic time they were seen.

    The cheap head position is polled first (each command stores at least two events), then the
    decisions are counted, so events that are not decisions (checkpoints) cannot end the wait
    early. Raises RuntimeError on timeout or when a worker process died before the end.
    """
    deadline = time.monotonic() + timeout_seconds
    while True:
        if log_position(engine) >= 2 * commands and decision_counts(engine, accepted_type)[0] >= commands:
            return time.monotonic()
        if any(process.poll() is not None for process in workers):
            raise RuntimeError("a worker process exited before every command was decided")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{commands} decisions were not stored within {timeout_seconds:g}s")
        time.sleep(0.005)


def decision_counts(engine: Engine, accepted_type: str) -> tuple[int, int]:
    """(decision events, distinct decided commands): equal when each was decided exactly once.

    Events with no command (checkpoints) are not decisions and are not counted.
    """
    from events.tables import events_table

    query = select(func.count(events_table.c.command_id),
                   func.count(events_table.c.command_id.distinct())).where(
        events_table.c.event_type != accepted_type)
    with engine.connect() as conn:
        events, commands = conn.execute(query).one()
    return int(events), int(commands)


@contextmanager
def worker_processes(count: int, env: dict[str, str], log_path: Path,
                     connection: Redis) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` long-running `fleetctl worker` processes (forking RQ workers), ready on exit of setup.

    They start before the clock does, so their start-up (imports, reconcile) is not timed; they
    are stopped with SIGTERM (RQ's warm shutdown) by process id, then SIGKILL if they linger.
    """
    args = [sys.executable, "-m", "controlplane.cli.main", "worker"]
    processes: list[subprocess.Popen[bytes]] = []
    with log_path.open("ab") as log_file:
        try:
            for _ in range(count):
                processes.append(subprocess.Popen(
                    args, cwd=ROOT, env={**os.environ, **env}, stdout=log_file,
                    stderr=subprocess.STDOUT, start_new_session=True))
            deadline = time.monotonic() + WORKER_READY_TIMEOUT_SECONDS
            while Worker.count(connection=connection) < count:
                if any(p.poll() is not None for p in processes) or time.monotonic() > deadline:
                    raise RuntimeError(f"workers did not start; see {log_path}:\n"
                                       + tail(log_path))
                time.sleep(0.02)
            yield processes
        finally:
            stop_processes(processes)


def stop_processes(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """Warm-stop each process by its id; kill its own process group if it outlives the timeout."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=WORKER_STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the group holds only this worker and its horse
            process.wait()


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def as_jsonable(measurement: Measurement, **extra: Any) -> dict[str, Any]:
    return {"path": measurement.path, "store": measurement.store, "workers": measurement.workers,
            "commands": measurement.commands, "seconds": round(measurement.seconds, 4),
            "decisions_per_second": round(measurement.per_second, 1), "note": measurement.note,
            **extra}
