"""Decision throughput: the batched path beside the naive one and beside the storage floor.

Run `python bench/decisions_bench.py [--commands N] [--json]` (default N = 20,000). In one run it
times N mixed admission and placement commands end to end, from the validated commands to every
decision appended and projected: a fifth are placement commands on a fleet of 125 nodes x 8 GPUs
(`PlaceReplica` with its atomic GPU reservation, and `ReleaseReplica` of a pool's oldest replica
once it has eight, freeing its GPUs), the rest `AdmitRequest` and `ReleaseRequest` over four
pools of ready replicas (`controlplane.workloads.admission_and_placement`, seeded). The fleet
(nodes, model, ready replicas) is set up before each run and not timed:

- batched: accept into the inbox, enqueue in jobs of FLEET_BATCH_SIZE ids, decide, append,
  project; on the embedded default (SQLite + in-process fakeredis + in-process worker), on real
  Redis + SQLite and on real Redis + PostgreSQL with 1, 2 and 4 forking worker processes;
- naive: the same with one RQ job per command (batch size 1), on fewer commands (rates are per
  command, so the ratio stays fair);
- floor: one bulk insert of the very rows the timed commands of the batched run stored (their
  CommandAccepted and decision events, copied) into the same table of the same kind of database.

Every run checks that each accepted command was decided exactly once. Scratch databases, the Redis db and
the worker processes are the benchmark's own and are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from redis import Redis  # noqa: E402

from bench.common import (  # noqa: E402
    DEFAULT_POSTGRES_URL,
    BenchSkipped,
    Measurement,
    check_exactly_once,
    count,
    environment,
    log_position,
    postgres_database,
    redis_db,
    reset_log,
    storage_floor,
    stored_rows,
    wait_for_decisions,
)
from bench.decision_results import (  # noqa: E402
    EMBEDDED,
    POSTGRES_REDIS,
    SEED,
    SQLITE_REDIS,
    Results,
)
from bench.figures import add_figures_argument, write_figures  # noqa: E402
from bench.machine import cores_busy, cpu_jiffies, load_average  # noqa: E402
from bench.worker_pool import WorkerPool, tail  # noqa: E402
from controlplane.commands import CommandBase, command_adapter  # noqa: E402
from controlplane.logging import configure_logging  # noqa: E402
from controlplane.runtime import open_store, store_for_process  # noqa: E402
from controlplane.settings import Settings  # noqa: E402
from controlplane.workloads import admission_and_placement  # noqa: E402
from events.store import EventStore  # noqa: E402
from workers.claims import claim_key  # noqa: E402
from workers.pipeline import submit  # noqa: E402

DEFAULT_COMMANDS = 20_000
Setup = list[list[dict[str, Any]]]
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/14"
WORKER_COUNTS = (1, 2, 4)
# A run that has not finished by then (under 20 decisions/s, or a minute) is reported as stuck.
MIN_DECISIONS_PER_SECOND = 20.0
MIN_RUN_TIMEOUT_SECONDS = 60.0


def workload(commands: int, seed: int) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """The fleet's setup phases (not timed) and `commands` mixed admission and placement payloads.

    See `controlplane.workloads.admission_and_placement`: a fifth are single-GPU placements and
    replica releases on 125 nodes x 8 GPUs, the rest admissions and releases over four pools.
    """
    return admission_and_placement(seed, commands)


def commands_for(payloads: Sequence[dict[str, Any]], run: str) -> list[CommandBase]:
    """The payloads as validated commands with ids unique to `run` (validation is not timed)."""
    return [command_adapter.validate_python({**p, "command_id": f"{run}-{p['command_id']}"})
            for p in payloads]


def commands_in(setup: Setup) -> int:
    return sum(len(phase) for phase in setup)


def set_up(settings: Settings, store: EventStore, setup: Setup, run: str,
           workers: Sequence[Any] = ()) -> int:
    """Decide the setup phases in order (not timed); returns the log position they end at."""
    for index, phase in enumerate(setup):
        submit(settings, store, commands_for(phase, f"{run}-s{index}"))
        wait_for_decisions(store.engine, MIN_RUN_TIMEOUT_SECONDS, workers)
    return log_position(store.engine)


def run_embedded(path: str, setup: Setup, traffic: list[dict[str, Any]], batch_size: int,
                 scratch: Path) -> tuple[Measurement, list[dict[str, Any]]]:
    """Submit on the embedded default: the in-process worker decides before `submit` returns.

    Returns the measurement and the rows the timed commands stored (for the floor).
    """
    from fakeredis import FakeRedis

    from workers.connections import embedded_server

    url = f"sqlite:///{scratch}/{path}-embedded.db"
    run = f"{path[0]}-emb"
    with environment(FLEET_DATABASE_URL=url, FLEET_REDIS_URL=None):
        store = open_store(url)
        store_for_process()  # the job's store, opened once per process as in a real worker
        FakeRedis(server=embedded_server()).flushall()
        settings = Settings(database_url=url, batch_size=batch_size)
        set_up(settings, store, setup, run)
        timed_from = log_position(store.engine)
        commands = commands_for(traffic, run)
        cpu, started = cpu_jiffies(), time.perf_counter()
        submit(settings, store, commands)
        seconds, busy = time.perf_counter() - started, cores_busy(cpu, cpu_jiffies())
    check_exactly_once(store, f"{path} {EMBEDDED}", commands_in(setup) + len(commands))
    rows = stored_rows(store, timed_from)
    store.engine.dispose()
    return Measurement(path, EMBEDDED, "in-process", len(commands), seconds,
                       cores_busy=busy), rows


def run_queued(path: str, store_label: str, setup: Setup, traffic: list[dict[str, Any]],
               batch_size: int, store: EventStore, redis_url: str,
               pool: WorkerPool) -> tuple[Measurement, int]:
    """Submit to real Redis with the pool's forking worker processes already waiting.

    Returns the measurement and the log position the timed commands started after.
    """
    reset_log(store)
    workers = len(pool.processes)
    label = f"{path} {store_label} x{workers}"
    settings = Settings(database_url=store.engine.url.render_as_string(hide_password=False),
                        redis_url=redis_url, batch_size=batch_size)
    # The log starts over in the same database, a new log: the workers' claim on the queue
    # names the old one (`workers.claims`) and would refuse this run's submits until renewed.
    Redis.from_url(redis_url).delete(claim_key(settings.command_queue))
    run = f"{path[0]}{workers}"
    timed_from = set_up(settings, store, setup, run, pool.processes)
    commands = commands_for(traffic, run)
    timeout = max(MIN_RUN_TIMEOUT_SECONDS, len(commands) / MIN_DECISIONS_PER_SECOND)
    log_from, cpu, started = pool.log_size(), cpu_jiffies(), time.monotonic()
    submit(settings, store, commands)
    try:
        finished = wait_for_decisions(store.engine, timeout, pool.processes)
    except RuntimeError as error:
        raise RuntimeError(f"{label}: {error}; the workers' log ends:\n{tail(pool.log_path)}") \
            from None
    busy = cores_busy(cpu, cpu_jiffies())
    check_exactly_once(store, label, commands_in(setup) + len(commands))
    held = pool.lock_held_seconds(log_from, len(commands))
    return Measurement(path, store_label, str(workers), len(commands), finished - started,
                       cores_busy=busy,
                       lock_held=None if held is None else held / (finished - started)), timed_from


def run_all(args: argparse.Namespace, results: Results, progress: Callable[[str], None]) -> None:
    setup, traffic = workload(args.commands, SEED)
    naive_traffic = traffic[:args.naive_commands]
    batch_size = Settings.from_env().batch_size
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as directory:
        scratch = Path(directory)
        if "embedded" in args.only:
            progress("embedded: batched")
            run, rows = run_embedded("batched", setup, traffic, batch_size, scratch)
            results.runs.append(run)
            results.floors["sqlite"] = storage_floor(f"sqlite:///{scratch}/floor.db", rows,
                                                     "sqlite", run.commands)
            progress("embedded: naive")
            results.runs.append(run_embedded("naive", setup, naive_traffic, 1, scratch)[0])
        for label, wanted in ((SQLITE_REDIS, "sqlite"), (POSTGRES_REDIS, "postgres")):
            if wanted not in args.only:
                continue
            try:
                run_real_store(args, results, label, setup, traffic, naive_traffic, batch_size, scratch,
                               progress)
            except BenchSkipped as skipped:
                results.skipped.append(f"{label}: {skipped}")
            except RuntimeError as failure:  # a stuck or wrong run: report it, run the rest
                results.failed.append(f"{label}: {failure}")


def run_real_store(args: argparse.Namespace, results: Results, label: str,
                   setup: Setup, traffic: list[dict[str, Any]],
                   naive_traffic: list[dict[str, Any]],
                   batch_size: int, scratch: Path, progress: Callable[[str], None]) -> None:
    """Naive and batched runs on one database, the worker pool growing 1 -> 2 -> 4 between runs."""
    floor_key = "postgres" if label == POSTGRES_REDIS else "sqlite"
    with _database(label, args.postgres_url, scratch) as url, redis_db(args.redis_url) as redis:
        store = open_store(url)
        # INFO: each batch's line says how long it held the append lock (`lock held` column).
        env = {"FLEET_DATABASE_URL": url, "FLEET_REDIS_URL": args.redis_url,
               "FLEET_LOG_LEVEL": "INFO"}
        with WorkerPool(env, scratch / f"{label}-workers.log", redis) as pool:
            for workers in sorted(set(WORKER_COUNTS) | set(args.naive_workers)):
                pool.grow_to(workers)
                if workers in args.naive_workers:
                    progress(f"{label}: naive, {workers} worker(s)")
                    results.runs.append(run_queued("naive", label, setup, naive_traffic, 1, store,
                                                   args.redis_url, pool)[0])
                if workers in WORKER_COUNTS:
                    progress(f"{label}: batched, {workers} worker(s)")
                    run, timed_from = run_queued("batched", label, setup, traffic, batch_size,
                                                 store, args.redis_url, pool)
                    results.runs.append(run)
                    if floor_key not in results.floors:
                        results.floors[floor_key] = storage_floor(url, stored_rows(store, timed_from),
                                                                  floor_key, run.commands)
        store.engine.dispose()


@contextmanager
def _database(label: str, postgres_url: str, scratch: Path) -> Iterator[str]:
    if label == POSTGRES_REDIS:
        with postgres_database(postgres_url) as url:
            yield url
    else:
        yield f"sqlite:///{scratch}/{label}.db"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=count(), default=DEFAULT_COMMANDS,
                        help="commands per batched run (default 20,000)")
    parser.add_argument("--naive-commands", type=count(), default=None,
                        help="commands per naive run (default: a fiftieth of --commands, >= 20)")
    parser.add_argument("--naive-workers", type=count(), nargs="+", default=[1],
                        help="worker counts for the naive runs on real Redis (default 1)")
    parser.add_argument("--only", nargs="+", default=["embedded", "sqlite", "postgres"],
                        choices=["embedded", "sqlite", "postgres"], help="scenarios to run")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL,
                        help="server on which a fleet_bench_<random> database is created")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_figures_argument(parser)
    args = parser.parse_args(argv)
    if args.naive_commands is None:
        args.naive_commands = max(20, args.commands // 50)
    args.naive_commands = min(args.naive_commands, args.commands)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    configure_logging("WARNING")
    results = Results()

    def progress(message: str) -> None:
        print(f"... {message}", file=sys.stderr, flush=True)

    started, load_before = time.monotonic(), load_average()
    run_all(args, results, progress)
    elapsed, load_after = time.monotonic() - started, load_average()
    write_figures(args.figures_out, results.figures())
    if args.json:
        report = results.as_json(args.commands, args.naive_commands, Settings.from_env().batch_size)
        report.update(seconds=round(elapsed, 1), load_average=[load_before, load_after])
        print(json.dumps(report, indent=2))
    else:
        print(f"decision throughput (seed {SEED}, batch size {Settings.from_env().batch_size}, "
              f"{args.commands:,} commands batched, {args.naive_commands:,} naive; took "
              f"{elapsed:.0f}s; load average {load_before} -> {load_after} on {os.cpu_count()} CPUs)")
        print(results.table())
        print("naive runs use fewer commands; every rate is per command, so the ratios compare like"
              " with like.\nx naive: against the naive run on the same store (same workers if"
              " measured, else 1).\nfloor: one bulk insert of the rows the timed commands of the first"
              " batched run on that database stored (CommandAccepted + decision events), copied,"
              " into an empty log.\ncores busy: the machine's CPUs in use during the run, on average (every"
              " process: workers, database, Redis, the submitter; of "
              f"{os.cpu_count()}).\nlock held: the share of the run some batch held the append"
              " lock (from the workers' batch_decided lines); near 1, more workers cannot help.")
        for goal, met in results.goals():
            print(f"goal: {goal}: {'not measured' if met is None else 'met' if met else 'MISSED'}")
        for line in [f"skipped: {s}" for s in results.skipped] + [f"FAILED: {f}" for f in results.failed]:
            print(line)
    if results.failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
