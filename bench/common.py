"""What the benchmarks share: scratch stores and Redis, worker processes, the floor, the table.

Every resource here is the benchmark's own and is removed on exit: SQLite files live in a
temporary directory, a `fleet_bench_<random>` PostgreSQL database is dropped after, the Redis db
index is flushed before and after, and worker processes are stopped by their process ids.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis import Redis
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from controlplane.faults.invariants import InvariantReport, decided_exactly_once
from controlplane.runtime import open_store
from events import driver
from events.canonical import GENESIS_HASH
from events.projection_cache import forget
from events.rows import COLUMNS, INSERT_EVENTS, row_values
from events.store import EventStore

ROOT = Path(__file__).resolve().parents[1]
LOCAL_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# The server the benchmarks use: the tests' one when set (an empty value counts as unset).
DEFAULT_POSTGRES_URL = os.environ.get("FLEET_TEST_DATABASE_URL") or LOCAL_POSTGRES_URL


def count(minimum: int = 1) -> Callable[[str], int]:
    """An argparse type for a count of at least `minimum`: anything else is refused by name."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{number} is below the least allowed, {minimum}")
        return number

    return parse


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
    cores_busy: float | None = None  # the whole machine's CPUs busy during the run, on average
    lock_held: float | None = None  # the share of the run some batch held the append lock

    @property
    def per_second(self) -> float:
        return self.commands / self.seconds if self.seconds > 0 else 0.0

    def as_json(self, **extra: Any) -> dict[str, Any]:
        return {"path": self.path, "store": self.store, "workers": self.workers,
                "commands": self.commands, "seconds": round(self.seconds, 4),
                "decisions_per_second": round(self.per_second, 1), "note": self.note,
                "cores_busy": None if self.cores_busy is None else round(self.cores_busy, 2),
                "lock_held": None if self.lock_held is None else round(self.lock_held, 2),
                **extra}


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
def environment(**values: str | None) -> Iterator[None]:
    """Set (or, for None, unset) environment variables for the duration, then restore them."""
    saved = {name: os.environ.get(name) for name in values}

    def assign(settings: dict[str, str | None]) -> None:
        for name, value in settings.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    assign(values)
    try:
        yield
    finally:
        assign(saved)


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


def reset_log(store: EventStore) -> None:
    """Empty the log and its projections, so runs on one database start alike.

    PostgreSQL truncates: deleted rows would stay behind as dead tuples until vacuumed and slow
    every later run on the same database, so runs with more workers would be handicapped.
    """
    with store.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("TRUNCATE events, projections"))
        else:
            conn.execute(text("DELETE FROM events"))
            conn.execute(text("DELETE FROM projections"))
        conn.execute(text("UPDATE log_head SET position = 0, hash = :h"), {"h": GENESIS_HASH})
    forget(store.engine)


def log_position(engine: Engine) -> int:
    """The log's head position: how many events are stored."""
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT position FROM log_head WHERE id = 1")).scalar() or 0)


def any_undecided(engine: Engine) -> bool:
    """Whether an accepted command has no decision yet (a row of the `pending` projection)."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT 1 FROM projections WHERE name = 'pending' LIMIT 1")).first() is not None


def check_exactly_once(store: EventStore, label: str, expected: int) -> None:
    """RuntimeError unless the log holds `expected` accepted commands, each decided exactly once.

    The fault suite's invariant: each accepted command has decision events, all recording one
    read position (a second decision would record another).
    """
    report = InvariantReport()
    decided_exactly_once(store.read_all(), report)
    if report.violations:
        raise RuntimeError(f"{label}: {len(report.violations)} violation(s), first: "
                           f"{report.violations[0]}")
    if report.commands_accepted != expected or report.commands_decided != expected:
        raise RuntimeError(f"{label}: {report.commands_accepted} commands accepted and "
                           f"{report.commands_decided} decided, expected {expected}")


def wait_for_decisions(engine: Engine, timeout_seconds: float,
                       workers: Sequence[subprocess.Popen[bytes]] = ()) -> float:
    """Poll until no accepted command is undecided; returns the monotonic time that was seen.

    Call it after `submit` returned (the inbox is written by then). Polling must not slow the
    workers it times: it reads the one-row log head, and whether any command is undecided (one
    row at most) only while the head stands still. It returns when the head was first seen at
    its final position, once nothing is undecided and the head is still there after that check.
    Raises RuntimeError on timeout or when a worker process died before the end.
    """
    deadline = time.monotonic() + timeout_seconds
    last_head, since = -1, time.monotonic()
    while True:
        head, now = log_position(engine), time.monotonic()
        if head != last_head:
            last_head, since = head, now
        elif not any_undecided(engine) and log_position(engine) == last_head:
            return since
        if any(process.poll() is not None for process in workers):
            raise RuntimeError("a worker process exited before every command was decided")
        if now > deadline:
            raise RuntimeError(f"commands were still undecided after {timeout_seconds:g}s")
        time.sleep(0.01)


def stored_rows(store: EventStore, after_position: int = 0) -> list[dict[str, Any]]:
    """Event rows after `after_position` exactly as stored (data as JSON text), in order."""
    return list(store.read_all(from_position=after_position, raw=True))


FLOOR_REPEATS = 3


def storage_floor(database_url: str, rows: list[dict[str, Any]], store_label: str,
                  decisions: int, repeats: int = FLOOR_REPEATS) -> Measurement:
    """Bulk-insert copies of real stored rows into the emptied events table, in one transaction.

    The insert is the appender's own for a large batch (PostgreSQL: the driver's COPY; SQLite:
    its executemany), of the row values prepared before the clock starts. Timed `repeats`
    times; the median is the floor (one insert of a few tens of thousands of rows varies by
    half between runs on a shared disk, as the kernel writes back earlier runs' pages).
    """
    store = open_store(database_url)
    values = [row_values(row) for row in rows]
    timings = []
    for _ in range(repeats):
        reset_log(store)
        started = time.perf_counter()
        with store.engine.connect().execution_options(fleet_write=True) as conn, conn.begin():
            if driver.can_copy(conn):
                driver.copy_rows(conn, "events", COLUMNS, values)
            else:
                driver.execute_many(conn, INSERT_EVENTS, values)
        timings.append(time.perf_counter() - started)
    reset_log(store)
    store.engine.dispose()
    seconds = statistics.median(timings)
    return Measurement("floor", store_label, "-", decisions, seconds,
                       f"one bulk insert of {len(rows)} copied event rows, median of "
                       f"{', '.join(f'{t:.2f}' for t in timings)} s")
