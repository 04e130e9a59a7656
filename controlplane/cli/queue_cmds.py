"""Subcommands that move commands: init, submit, worker, up, reconcile."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from controlplane.cli.context import WAIT_SECONDS, settings_and_store
from controlplane.cli.output import announce, emit, fail
from controlplane.commands import CommandBase
from controlplane.errors import InputError, OperationalError
from controlplane.files import read_at_most
from controlplane.service import Outcome
from controlplane.settings import MAX_WORKER_PROCESSES, Settings, redacted_url
from controlplane.submission import MAX_SUBMISSION_BYTES, read_submission
from events.database import migrate
from events.store import EventStore
from workers.connections import connect, redis_url_in_use
from workers.outage import mark_queue
from workers.pipeline import EMBEDDED_HINT, wait_for_decisions
from workers.pipeline import reconcile as reconcile_pending
from workers.pipeline import submit as submit_commands
from workers.runner import EmbeddedRedisServer, advertise, serve, spawn_worker_processes, work

json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


@click.command()
@json_option
def init(as_json: bool) -> None:
    """Create or upgrade the database schema (alembic upgrade head)."""
    _, store = settings_and_store()
    migrate(store.engine)
    position, _ = store.head()
    emit({"schema": "current", "log_position": position}, as_json,
         lambda r: f"schema is current; the log is at position {r['log_position']}")


def _read_source(source: str) -> str:
    """The submission's text: at most MAX_SUBMISSION_BYTES of UTF-8, from a file or stdin."""
    limit = MAX_SUBMISSION_BYTES
    if source != "-":
        raw = read_at_most(Path(source), limit)
    elif sys.stdin is None:  # started with standard input closed (`<&-`)
        raise InputError("cannot read standard input: it is closed")
    else:
        try:
            raw = sys.stdin.buffer.read(limit + 1)
        except OSError as error:
            raise InputError(f"cannot read standard input: {error.strerror}") from None
        if len(raw) > limit:
            raise InputError(f"the submission is larger than {limit} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        name = "standard input" if source == "-" else source
        raise InputError(f"{name} is not UTF-8 text (byte {error.start})") from None


def _render_outcomes(outcomes: list[Outcome]) -> str:
    lines = []
    for outcome in outcomes:
        summary = outcome.summary()
        lines.append(f"{summary['command_id']}  {summary['outcome']}  "
                     f"{', '.join(summary['reasons'])}")
    return "\n".join(lines)


@click.command()
@click.argument("source")
@click.option("--wait", is_flag=True, help="Wait for the decisions and print them.")
@click.option("--timeout", "timeout_seconds", type=WAIT_SECONDS, default=60.0,
              show_default=True, help="Seconds --wait waits before giving up (exit 3).")
@json_option
@click.pass_context
def submit(ctx: click.Context, source: str, wait: bool, timeout_seconds: float,
           as_json: bool) -> None:
    """Validate commands from SOURCE (a file or -; JSON Lines or a JSON array), record, enqueue.

    Nothing is written unless every command is valid. Interrupted (exit 130), the commands
    accepted so far stay in the inbox for `fleetctl reconcile`.
    """
    submission = read_submission(_read_source(source))
    settings, store = settings_and_store()
    try:
        _submit(submission.commands, submission.lines, settings, store, wait, timeout_seconds,
                as_json)
    except KeyboardInterrupt:
        fail("interrupted; commands already accepted stay in the inbox "
             "(`fleetctl reconcile` enqueues them)")
        ctx.exit(130)


def _submit(commands: list[CommandBase], lines: list[int], settings: Settings,
            store: EventStore, wait: bool, timeout_seconds: float, as_json: bool) -> None:
    # --wait bounds the work, also where it runs in this process (embedded): the decisions
    # not made by then stay in the inbox. Without it the embedded queue decides everything.
    deadline = time.monotonic() + timeout_seconds if wait else None
    result = submit_commands(settings, store, commands, lines, deadline)
    report: dict[str, Any] = {"accepted": len(result.accepted_ids),
                              "already_accepted": len(commands) - len(result.accepted_ids),
                              "jobs": len(result.job_ids),
                              "decided_in_process": result.ran_in_process}
    if wait or result.ran_in_process:
        ids = list(dict.fromkeys(c.command_id for c in commands))
        if result.ran_in_process:  # the work is over: whatever is undecided now stays so
            outcomes = wait_for_decisions(store, ids, timeout_seconds, EMBEDDED_HINT, poll=False)
        else:
            outcomes = wait_for_decisions(store, ids, timeout_seconds)
        report["decisions"] = [o.summary() for o in outcomes]
        emit(report, as_json, lambda _: _render_outcomes(outcomes))
        return
    emit(report, as_json, lambda r: f"accepted {r['accepted']} command(s) "
         f"({r['already_accepted']} already accepted) in {r['jobs']} job(s)")


@click.command()
@click.option("--burst", is_flag=True, help="Stop when the queues are empty.")
@click.option("--queues", "queue_names", multiple=True,
              help="Queues to serve (repeatable; default FLEET_QUEUE, else fleet-commands).")
@click.option("--processes", type=click.IntRange(min=1, max=MAX_WORKER_PROCESSES), default=1,
              show_default=True, help="Worker processes to run.")
@json_option
def worker(burst: bool, queue_names: tuple[str, ...], processes: int, as_json: bool) -> None:
    """Run forking RQ workers on FLEET_REDIS_URL (embedded: drain in-process, then stop)."""
    settings, store = settings_and_store()
    queues = queue_names or settings.queues
    url = redis_url_in_use(settings)
    if not burst and url is not None:
        # Before the reconcile: a Redis that loses its data after it is noticed (workers.outage).
        mark_queue(connect(settings), queues[0])
    reconciled = reconcile_pending(settings, store)
    if url is None:
        if as_json:
            announce({"queue": "embedded", "re_enqueued": len(reconciled.accepted_ids),
                      "decided_in_process": True}, as_json=True)
        else:
            click.echo("embedded queue: decided every pending command in-process", err=True)
        return
    if as_json:  # the start-up line: one JSON object, before the workers run
        announce({"queue": redacted_url(url), "queues": list(queues), "processes": processes,
                  "burst": burst, "re_enqueued": len(reconciled.accepted_ids)}, as_json=True)
    children = spawn_worker_processes(processes - 1, url, queues) if processes > 1 else []
    try:
        if burst:
            work(connect(settings), queues, burst=True, forking=True)
        else:  # through a lost Redis: wait for it, reconcile (it may be back empty), go on
            serve(lambda: connect(settings), queues, lambda: reconcile_pending(settings, store))
    finally:
        for child in children:
            if burst:
                child.wait()
            else:
                child.terminate()


@click.command()
@click.option("--port", type=click.IntRange(min=0, max=65_535), default=0,
              help="Loopback port for the embedded Redis (0: any free).")
@click.option("--workers", "worker_count", type=click.IntRange(min=0, max=MAX_WORKER_PROCESSES),
              default=2, show_default=True,
              help="Forking worker processes to run (0: serve the Redis only).")
@json_option
def up(port: int, worker_count: int, as_json: bool) -> None:
    """Serve the embedded fake Redis on a loopback port plus workers, until interrupted."""
    settings, store = settings_and_store()
    try:
        server = EmbeddedRedisServer(port)
    except OSError as error:
        raise OperationalError(f"cannot serve the embedded Redis on 127.0.0.1:{port}: "
                               f"{error.strerror or error}") from None
    # Installed before anything is advertised: a SIGTERM that comes as soon as the announcement
    # is read must still stop the workers and remove the up file, not kill this process.
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    with server:
        path = advertise(settings, server.url)
        children: list[subprocess.Popen[bytes]] = []
        try:
            children = spawn_worker_processes(worker_count, server.url, settings.queues)
            announce({"redis_url": server.url, "workers": worker_count,
                      "up_file": None if path is None else str(path)}, as_json,
                     lambda r: f"serving the embedded Redis at {r['redis_url']} with "
                               f"{r['workers']} worker(s); `fleetctl submit` here reaches them "
                               f"(or export FLEET_REDIS_URL={r['redis_url']})")
            while not stop["now"] and all(child.poll() is None for child in children):
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            for child in children:
                child.terminate()
            for child in children:
                child.wait(timeout=10)
            if path is not None and path.exists():
                path.unlink()


@click.command()
@json_option
def reconcile(as_json: bool) -> None:
    """Re-enqueue accepted commands that have no decision (e.g. after Redis lost its queue)."""
    settings, store = settings_and_store()
    result = reconcile_pending(settings, store)
    emit({"re_enqueued": len(result.accepted_ids), "jobs": len(result.job_ids),
          "decided_in_process": result.ran_in_process}, as_json,
         lambda r: f"re-enqueued {r['re_enqueued']} undecided command(s) in {r['jobs']} job(s)")
