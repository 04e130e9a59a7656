"""`fleetctl simulate TRACE`: replay a production trace through the control plane on a virtual clock.

Exit 0 when the run completes; 2 for a bad trace (file and line named), option or log path,
refused before the log is created; 1 when the control plane refuses to place even the first
replica (a decision, recorded in the log).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import click
from sqlalchemy import inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from controlplane.cli.context import FiniteFloatRange
from controlplane.cli.output import emit, progress
from controlplane.errors import InputError, OperationalError
from controlplane.files import check_writable
from controlplane.runtime import open_store
from controlplane.settings import in_memory_sqlite, redacted_url
from controlplane.simulation.chart import write_chart
from controlplane.simulation.config import MAX_REPLICAS, SimulationConfig
from controlplane.simulation.fleet import resolve_catalog
from controlplane.simulation.report import build_report, render
from controlplane.simulation.routing import Routing
from controlplane.simulation.run import Simulation
from controlplane.simulation.traces import read_trace
from events.database import schema_is_current
from events.store import EventStore

REPLICAS = click.IntRange(min=1, max=MAX_REPLICAS)  # why this bound: `MAX_REPLICAS`


def _log_url(log: str, overwrite: bool) -> str:
    """The URL of the simulation's own log: a fresh SQLite file (or an empty database named
    by URL). InputError naming --log unless that file can be created where it is named (its
    directory exists and is writable; so for a SQLite URL's file) and, without --overwrite,
    does not exist yet. Touches nothing."""
    if "://" in log:
        if in_memory_sqlite(log):
            raise InputError(f"--log {log} names a SQLite database in memory, which keeps "
                             "nothing once the simulation ends: name a file")
        if overwrite and _sqlite_file(log) is None:
            raise InputError(f"--overwrite replaces a SQLite --log file; a database named by "
                             f"URL ({redacted_url(log)}) is never emptied by fleetctl: name an "
                             "empty one")
        _check_sqlite_file(log)
        return log
    if log.endswith(("/", os.sep)):
        raise InputError(f"--log {log} names a directory; name a file")
    path = Path(log)
    check_writable(path, "--log")  # refuses a directory too
    if path.exists() and not overwrite:
        raise InputError(f"--log {log} already exists; pass --overwrite or another --log "
                         "(a simulation writes a log of its own)")
    return f"sqlite:///{path}"


def _remove_old_log(log: str) -> None:
    """What --overwrite replaces: the old --log file (named or by SQLite URL) and its SQLite
    journals."""
    file = _sqlite_file(log) if "://" in log else Path(log)
    if file is not None:
        for stale in (file, Path(f"{file}-wal"), Path(f"{file}-shm")):
            stale.unlink(missing_ok=True)


def _empty_log(url: str, log: str) -> EventStore:
    """The store of a log with no events, schema created; InputError naming --log for a
    database that holds anything else (events, or tables that are not a current log): the
    schema is created only in an empty database, never in somebody else's."""
    store = open_store(url, migrate=False, url_source="--log")
    try:
        tables = inspect(store.engine).get_table_names()
        current = bool(tables) and schema_is_current(store.engine)
    except SQLAlchemyError as error:
        store.engine.dispose()
        raise OperationalError(f"cannot open --log {redacted_url(log)}: "
                               f"{type(error).__name__}") from None
    if tables and not current:
        store.engine.dispose()
        named = ", ".join(sorted(tables)[:3]) + (", …" if len(tables) > 3 else "")
        raise InputError(f"--log {redacted_url(log)} holds tables that are not a current log "
                         f"({named}); a simulation needs an empty database")
    if current and store.head()[0] != 0:
        store.engine.dispose()
        raise InputError(f"--log {redacted_url(log)} already holds events; a simulation needs an "
                         "empty log")
    if not tables:
        store.engine.dispose()
        store = open_store(url, url_source="--log")
    return store


def _sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names; None for any other URL (or one `open_store` refuses)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None  # `open_store` refuses it, naming --log
    database = parsed.database
    if parsed.get_backend_name() == "sqlite" and database and database != ":memory:" \
            and not database.startswith("file:"):
        return Path(database)
    return None


def _check_sqlite_file(url: str) -> None:
    """A SQLite URL's file must be creatable, as a --log path must (SQLite would fail later,
    as an operational error naming nothing); other URLs are checked when opened."""
    file = _sqlite_file(url)
    if file is not None:
        check_writable(file, "--log")


@click.command("simulate")
@click.argument("trace", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--limit", type=click.IntRange(min=1),
              help="Simulate only the first N requests (any N past the trace's end: all of it).")
@click.option("--routing", type=click.Choice([r.value for r in Routing]), default="prefix",
              show_default=True, help="Prefix-aware (longest cached prefix) or round-robin.")
@click.option("--replicas", type=REPLICAS, default=1, show_default=True,
              help="Replicas placed and ready at the start; at most --max-replicas.")
@click.option("--min-replicas", type=REPLICAS, default=1, show_default=True,
              help="The autoscaler's lower bound; at most --max-replicas.")
@click.option("--max-replicas", type=REPLICAS, default=8, show_default=True,
              help=f"The autoscaler's upper bound; at most {MAX_REPLICAS}.")
@click.option("--no-autoscale", is_flag=True, help="Keep the initial replicas throughout.")
@click.option("--no-rollout", is_flag=True, help="Run no canary rollout.")
@click.option("--model", "model_id", default="meta-llama/Llama-3.1-8B", show_default=True,
              help="Catalog model id.")
@click.option("--gpu", "gpu_id", default="H100-SXM-80GB", show_default=True,
              help="Catalog GPU id or alias.")
@click.option("--speedup", type=click.FloatRange(min=0, min_open=True, max=1e6), default=1.0,
              show_default=True, help="Arrivals come this many times faster than the trace.")
@click.option("--control-interval", type=FiniteFloatRange(min=0.01, max=3600), default=2.0,
              show_default=True, help="Seconds between control ticks (completion reports).")
@click.option("--warmup-seconds", type=FiniteFloatRange(min=0.01, max=86_400), default=60.0,
              show_default=True, help="Load time of a replica the autoscaler adds.")
@click.option("--deadline-seconds", type=FiniteFloatRange(min=0.01, max=86_400), default=60.0,
              show_default=True, help="Each request's deadline after its arrival.")
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("simulation.svg"), show_default=True, help="Where to write the SVG chart.")
@click.option("--no-chart", is_flag=True, help="Write no chart.")
@click.option("--log", "log", default="simulation.db", show_default=True,
              help="The run's own log: a SQLite file (or an empty database URL).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --log file.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def simulate(trace: Path, limit: int | None, routing: str, replicas: int, min_replicas: int,
             max_replicas: int, no_autoscale: bool, no_rollout: bool, model_id: str, gpu_id: str,
             speedup: float, control_interval: float, warmup_seconds: float,
             deadline_seconds: float, chart_path: Path, no_chart: bool, log: str,
             overwrite: bool, as_json: bool) -> int:
    """Drive admission, routing, autoscaling and a rollout through the log from a TRACE."""
    if not no_chart and chart_path.suffix.lower() != ".svg":
        raise InputError(f"--chart {chart_path}: only SVG charts are written (use a .svg name)")
    config = SimulationConfig(
        routing=Routing(routing), model_id=model_id, gpu_id=gpu_id, initial_replicas=replicas,
        min_replicas=min_replicas, max_replicas=max_replicas, speedup=speedup,
        control_interval_seconds=control_interval, autoscale=not no_autoscale,
        warmup_seconds=warmup_seconds, deadline_seconds=deadline_seconds,
        rollout=not no_rollout).validate()
    # Every input is checked before the log is created or touched: a refused run leaves none.
    if not no_chart:
        check_writable(chart_path, "--chart")
    url = _log_url(log, overwrite)
    resolve_catalog(config)
    requests = read_trace(trace, limit)
    config.validate_for(requests)
    if overwrite:
        _remove_old_log(log)
    store = _empty_log(url, log)
    with progress("simulating") as report_progress:
        started = time.perf_counter()
        run = Simulation(requests, config, store, report_progress).run()
        wall_seconds = time.perf_counter() - started
    report = build_report(run, wall_seconds, url, None if no_chart else str(chart_path))
    if not no_chart:
        write_chart(report, chart_path)
    store.engine.dispose()
    emit(report, as_json, render)
    return 0
