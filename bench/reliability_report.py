"""The figures of RELIABILITY.md: seeded fault runs on real workers, and the fuzz suite's inputs.

    python bench/reliability_report.py [--runs N] [--json]
    python bench/reliability_report.py --kind worker_sigkill --seed 20261130 --only sqlite

It runs the fault plan of `tests/e2e/test_faults.py` (the same kinds and seeds; `--runs N` runs
of each kind on each database, a kind bound to one database gets N per database offered), then
`pytest tests/fuzz` with Hypothesis statistics, and prints: commands decided under faults,
faults injected and survived, bad inputs tried, records lost. Exit 1 if any run broke an
invariant, lost a record or the fuzz suite failed.

What it needs: `redis-server` on PATH (each run gets a private one, or pass `--redis-url` to use
a server of your own with a private queue name, removed after), and for the PostgreSQL runs a
server (`--postgres-url`, default FLEET_TEST_DATABASE_URL or the local `test` database) where it
creates a `fleet_bench_<random>` database and drops it after; unreachable, those runs are skipped.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from redis import Redis  # noqa: E402

from bench.common import (  # noqa: E402
    DEFAULT_POSTGRES_URL,
    BenchSkipped,
    count,
    format_table,
    postgres_database,
    reset_log,
)
from controlplane.faults import (  # noqa: E402
    DATABASES,
    FAULT_KINDS,
    FaultRun,
    FaultTarget,
    planned_runs,
    run_fault,
    seed_for,
)
from controlplane.faults.harness import FaultSetupError, RedisServer  # noqa: E402
from controlplane.logging import configure_logging  # noqa: E402
from controlplane.runtime import open_store  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STATISTICS = re.compile(r"- (\d+) passing, (\d+) failing")
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|error)")


@contextmanager
def queue_on(redis_url: str | None, scratch: Path) -> Iterator[tuple[str, str]]:
    """(redis url, queue name): a private redis-server, or a private queue on the given server."""
    queue = f"fleet-reliability-{uuid.uuid4().hex[:10]}"
    if redis_url is None:
        server = RedisServer(scratch)
        server.start()
        try:
            yield server.url, queue
        finally:
            server.kill()
        return
    connection = Redis.from_url(redis_url)
    try:
        yield redis_url, queue
    finally:
        keys = list(connection.scan_iter(match=f"*{queue}*", count=1_000))
        if keys:
            connection.delete(*keys)
        connection.close()


def one_run(kind: str, seed: int, database: str, args: argparse.Namespace,
            postgres_url: str | None, scratch: Path) -> FaultRun:
    """One seeded run on a fresh log (a new SQLite file, or the PostgreSQL database emptied)."""
    if database == "sqlite":
        database_url = f"sqlite:///{scratch}/fleet.db"
    else:
        assert postgres_url is not None
        database_url = postgres_url
        store = open_store(postgres_url)
        reset_log(store)
        store.engine.dispose()
    with queue_on(args.redis_url, scratch) as (redis_url, queue):
        return run_fault(kind, seed, FaultTarget(database_url, redis_url, queue, scratch),
                         args.requests)


def fuzz_figures() -> dict[str, Any]:
    """Run `pytest tests/fuzz` and count its inputs: every example Hypothesis ran, plus one for
    each other passing fuzz test case (a fixed bad input)."""
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/fuzz", "-q", "-p", "no:cacheprovider",
         "--hypothesis-show-statistics"], cwd=ROOT, capture_output=True, text=True, check=False)
    output = completed.stdout
    summary = {word: int(count) for count, word in SUMMARY.findall(output.splitlines()[-1])}
    examples = [(int(p), int(f)) for p, f in STATISTICS.findall(output)]
    passed = summary.get("passed", 0)
    return {"exit_code": completed.returncode, "tests_passed": passed,
            "tests_failed": summary.get("failed", 0) + summary.get("error", 0),
            "tests_skipped": summary.get("skipped", 0),
            "hypothesis_examples": sum(p + f for p, f in examples),
            "bad_inputs_tried": sum(p + f for p, f in examples) + passed - len(examples)}


def plan(args: argparse.Namespace, databases: Sequence[str]) -> list[tuple[str, str, int]]:
    """(kind, database, seed) of every run asked for."""
    kinds = args.kind or list(FAULT_KINDS)
    if args.seed is not None:
        return [(kind, database, args.seed) for kind in kinds for database in databases
                if FAULT_KINDS[kind].database in (None, database)]
    return [(kind, database, seed_for(kind, index, database))
            for kind, database, index in planned_runs(args.runs, tuple(databases)) if kind in kinds]


def table(runs: Sequence[FaultRun]) -> str:
    rows = []
    for kind in FAULT_KINDS:
        mine = [r for r in runs if r.kind == kind]
        if mine:
            rows.append([kind, len(mine), ",".join(sorted({r.database for r in mine})),
                         sum(r.commands_decided for r in mine),
                         f"{sum(r.faults_injected for r in mine)}/{sum(r.faults_planned for r in mine)}",
                         sum(r.duplicates_delivered for r in mine), sum(r.reconciles for r in mine),
                         sum(r.records_lost for r in mine), sum(len(r.violations) for r in mine)])
    headers = ["fault", "runs", "databases", "commands", "faults", "duplicates", "reconciles",
               "lost", "violations"]
    return format_table(headers, [[str(cell) for cell in row] for row in rows])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=count(), default=2, help="runs of each kind per database")
    parser.add_argument("--kind", action="append", choices=list(FAULT_KINDS))
    parser.add_argument("--only", action="append", choices=list(DATABASES))
    parser.add_argument("--seed", type=int, help="run exactly this seed (reproduce one run)")
    parser.add_argument("--requests", type=count(), default=80, help="admissions per scenario")
    parser.add_argument("--postgres-url", default=None)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--no-fuzz", action="store_true", help="skip the fuzz suite")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    configure_logging("ERROR")
    admin_url = args.postgres_url or DEFAULT_POSTGRES_URL
    databases = list(args.only or DATABASES)
    runs: list[FaultRun] = []
    skipped: list[str] = []
    began = time.monotonic()
    with ExitStack() as stack:
        postgres_url = None
        if "postgresql" in databases:
            try:
                postgres_url = stack.enter_context(postgres_database(admin_url))
            except BenchSkipped as why:
                skipped.append(f"postgresql: {why}")
                databases.remove("postgresql")
        for kind, database, seed in plan(args, databases):
            with tempfile.TemporaryDirectory(prefix="fleet-faults-") as scratch:
                try:
                    run = one_run(kind, seed, database, args, postgres_url, Path(scratch))
                except FaultSetupError as error:
                    print(f"reliability_report: {error}", file=sys.stderr)
                    return 2
            runs.append(run)
            status = "ok" if not run.violations and not run.records_lost else "FAILED"
            print(f"{status} fault={kind} seed={seed} database={database} "
                  f"faults={run.faults_injected} commands={run.commands_decided} "
                  f"{run.seconds:.1f}s", file=sys.stderr)
            for violation in run.violations[:5]:
                print(f"    {violation}  (reproduce: {run.reproduce()})", file=sys.stderr)
    fuzz = None if args.no_fuzz else fuzz_figures()
    totals = {
        "runs": len(runs),
        "commands_decided_under_faults": sum(r.commands_decided for r in runs),
        "faults_injected": sum(r.faults_injected for r in runs),
        "faults_survived": sum(r.faults_injected for r in runs if not r.violations),
        "workers_killed": sum(r.workers_killed for r in runs),
        "duplicate_deliveries": sum(r.duplicates_delivered for r in runs),
        "decisions_rederived": sum(r.decisions_rederived for r in runs),
        "records_lost": sum(r.records_lost for r in runs),
        "violations": sum(len(r.violations) for r in runs),
        "bad_inputs_tried": fuzz["bad_inputs_tried"] if fuzz else None,
        "seconds": round(time.monotonic() - began, 1),
    }
    failed = bool(totals["violations"] or totals["records_lost"]
                  or (fuzz is not None and fuzz["exit_code"] != 0))
    if args.json:
        print(json.dumps({"totals": totals, "fuzz": fuzz, "skipped": skipped,
                          "runs": [asdict(r) for r in runs]}, indent=2))
        return int(failed)
    print(table(runs))
    print()
    print(f"commands decided under faults: {totals['commands_decided_under_faults']} "
          f"in {totals['runs']} seeded runs")
    print(f"faults injected and survived:  {totals['faults_survived']} of "
          f"{totals['faults_injected']} ({totals['workers_killed']} workers SIGKILLed, "
          f"{totals['duplicate_deliveries']} commands delivered again)")
    if fuzz is not None:
        print(f"bad inputs tried:              {fuzz['bad_inputs_tried']} "
              f"({fuzz['tests_passed']} fuzz tests passed, {fuzz['tests_failed']} failed, "
              f"{fuzz['tests_skipped']} skipped)")
    print(f"records lost:                  {totals['records_lost']}")
    for reason in skipped:
        print(f"skipped {reason}")
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
