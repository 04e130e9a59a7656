"""Writing a batch's rows to PostgreSQL: COPY (and a staged upsert) beside the pipelined inserts.

Run `python bench/bulk_write_bench.py [--commands N] [--postgres-url URL] [--json]`. It decides
the first N commands (default 1,000, one batch at the default `FLEET_BATCH_SIZE`) of the
decisions benchmark's mixed workload on a scratch SQLite log, untimed, and keeps what that batch
left: its event rows (accepted commands, decisions, checkpoints) and the projection rows it
added. Then, in a `fleet_bench_<random>` database on `--postgres-url`'s server (default
FLEET_TEST_DATABASE_URL, else the local server; dropped after), it times writing them in one
transaction, the two ways the appender can, alternately, `--repeats` times each:

- pipelined: the event rows by `executemany` and the projection rows by an upsert `executemany`,
  in one libpq pipeline through `driver.pipeline` (what a batch under 100 rows does);
- copied: `driver.copy_rows` for the events and `driver.copy_upsert` (a temporary staging table,
  then one INSERT ... ON CONFLICT) for the projection rows (what a larger batch does).

Before each timing the tables are emptied and half the projection rows are stored already, so
the upsert both inserts and updates, as a batch's does. It reports the median wall time and the
median CPU time of this process (the client's share) for each way, and their ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text  # noqa: E402
from sqlalchemy.engine import Connection  # noqa: E402

from bench.common import (  # noqa: E402
    DEFAULT_POSTGRES_URL,
    BenchSkipped,
    count,
    format_table,
    postgres_database,
    reset_log,
    stored_rows,
)
from bench.decisions_bench import commands_for, workload  # noqa: E402
from bench.figures import Figure, add_figures_argument, write_figures  # noqa: E402
from controlplane.logging import configure_logging  # noqa: E402
from controlplane.runtime import open_store  # noqa: E402
from controlplane.service import accept, decide  # noqa: E402
from events import driver  # noqa: E402
from events.canonical import canonical_json  # noqa: E402
from events.projections import PROJECTION_COLUMNS, UPSERT_ROWS, load_all  # noqa: E402
from events.rows import COLUMNS, INSERT_EVENTS, row_values  # noqa: E402

SEED = 20251130
Rows = list[tuple[Any, ...]]


def batch_rows(commands: int) -> tuple[Rows, Rows]:
    """The event rows and projection rows one batch of `commands` leaves (decided on SQLite)."""
    setup, traffic = workload(commands, SEED)
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as folder:
        store = open_store(f"sqlite:///{folder}/batch.db")
        for index, phase in enumerate(setup):
            decide(store, accept(store, commands_for(phase, f"s{index}")))
        with store.engine.connect() as conn:
            before = {(name, key) for name, rows in load_all(conn).items() for key in rows}
        start = store.head()[0]
        decide(store, accept(store, commands_for(traffic, "t")))
        events = [row_values(row) for row in stored_rows(store, start)]
        with store.engine.connect() as conn:
            projections = [(name, key, canonical_json(value))
                           for name, rows in load_all(conn).items() for key, value in rows.items()
                           if (name, key) not in before]
        store.engine.dispose()
    return events, projections


def pipelined(conn: Connection, events: Rows, projections: Rows) -> None:
    with driver.pipeline(conn):
        driver.execute_many(conn, INSERT_EVENTS, events)
        driver.execute_many(conn, UPSERT_ROWS, projections)


def copied(conn: Connection, events: Rows, projections: Rows) -> None:
    driver.copy_rows(conn, "events", COLUMNS, events)
    driver.copy_upsert(conn, "projections", PROJECTION_COLUMNS, "name, key", projections)


WAYS: dict[str, Callable[[Connection, Rows, Rows], None]] = {"pipelined": pipelined,
                                                              "copied": copied}


def run(url: str, events: Rows, projections: Rows, repeats: int) -> dict[str, Any]:
    store = open_store(url)
    timings: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    try:
        with store.engine.connect() as conn:
            if not driver.can_stage(conn):
                raise BenchSkipped("the database user may not create temporary tables")
            conn.rollback()
        for _ in range(repeats):
            for way, write in WAYS.items():
                reset_log(store)
                with store.engine.begin() as conn:  # half the rows are there: updated, not new
                    driver.execute_many(conn, UPSERT_ROWS, projections[::2])
                with store.engine.begin() as conn:
                    wall, cpu = time.perf_counter(), time.process_time()
                    write(conn, events, projections)
                timings[way].append((time.perf_counter() - wall, time.process_time() - cpu))
                with store.engine.connect() as conn:
                    stored = conn.execute(text("SELECT count(*) FROM events")).scalar()
                if stored != len(events):
                    raise RuntimeError(f"{way}: {stored} event rows stored of {len(events)}")
        reset_log(store)
    finally:
        store.engine.dispose()
    return {way: {"wall_ms": round(statistics.median(t[0] for t in samples) * 1000, 2),
                  "cpu_ms": round(statistics.median(t[1] for t in samples) * 1000, 2)}
            for way, samples in timings.items()}


def figures(report: dict[str, Any]) -> list[Figure]:
    if "results" not in report:
        return []
    ours, reference = report["results"]["copied"], report["results"]["pipelined"]
    name = f"write one {report['commands']:,}-command batch's rows to PostgreSQL"
    return [Figure(f"{name}, wall ms (COPY)", ours["wall_ms"], reference["wall_ms"], "ms",
                   "the same rows by pipelined executemany"),
            Figure(f"{name}, client CPU ms (COPY)", ours["cpu_ms"], reference["cpu_ms"], "ms",
                   "the same rows by pipelined executemany")]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=count(), default=1_000)
    parser.add_argument("--repeats", type=count(), default=7)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--json", action="store_true")
    add_figures_argument(parser)
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    events, projections = batch_rows(args.commands)
    report: dict[str, Any] = {"commands": args.commands, "event_rows": len(events),
                              "projection_rows": len(projections), "repeats": args.repeats}
    try:
        with postgres_database(args.postgres_url) as url:
            report["results"] = run(url, events, projections, args.repeats)
    except BenchSkipped as skipped:
        report["skipped"] = str(skipped)
    write_figures(args.figures_out, figures(report))
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"bulk writes: one batch of {args.commands:,} commands = {len(events):,} event rows and "
          f"{len(projections):,} projection rows (half already stored), median of {args.repeats}")
    if "skipped" in report:
        print(f"skipped: {report['skipped']}")
        return
    results = report["results"]
    rows = [[way, f"{r['wall_ms']:.1f}", f"{r['cpu_ms']:.1f}"] for way, r in results.items()]
    print(format_table(["way", "wall ms", "client CPU ms"], rows))
    print(f"copied / pipelined: wall {results['copied']['wall_ms'] / results['pipelined']['wall_ms']:.2f}, "
          f"client CPU {results['copied']['cpu_ms'] / results['pipelined']['cpu_ms']:.2f}")


if __name__ == "__main__":
    main()
