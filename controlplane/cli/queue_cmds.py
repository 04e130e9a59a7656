"""Subcommands that move commands: init, submit, worker, up, reconcile."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from controlplane.catalog.errors import CatalogError
from controlplane.catalog.registry import FIXTURES_ENV, fixtures_dir, load_catalog
from controlplane.cli.context import WAIT_SECONDS, settings_and_store
from controlplane.cli.output import announce, emit, fail
from controlplane.commands import CommandBase
from controlplane.errors import InputError, OperationalError
from controlplane.files import read_at_most
from controlplane.gateway.fixture_provider import usable_fixture_dir
from controlplane.service import Outcome
from controlplane.settings import MAX_WORKER_PROCESSES, Settings, checked_queue_name, redacted_url
from controlplane.submission import MAX_SUBMISSION_BYTES, read_submission
from events.database import migrate
from events.store import EventStore
from workers.claims import claim
from workers.connections import (
    UP_DATABASE_KEY,
    connect,
    redis_url_in_use,
    up_database,
)
from workers.outage import mark_queue
from workers.pipeline import EMBEDDED_HINT, Submitted, inbox_for, wait_for_decisions
from workers.pipeline import reconcile as reconcile_pending
from workers.pipeline import submit as submit_commands
from workers.runner import SUPERVISOR_ENV, EmbeddedRedisServer, UpFollower, drain, serve
from workers.stranded import sweep_seconds
from workers.supervision import StopSignals, UpFile, WorkerProcesses

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
    _catalog_readable_if_deciding_here(settings)
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


def _queue_names(ctx: click.Context, param: click.Parameter,
                 names: tuple[str, ...]) -> tuple[str, ...]:
    """Each --queues name as FLEET_QUEUE's are checked: one RQ and our job ids can use."""
    try:
        return tuple(checked_queue_name(name, "--queues") for name in names)
    except InputError as error:
        raise click.BadParameter(str(error).removeprefix("--queues "), ctx, param) from None


@click.command()
@click.option("--burst", is_flag=True, help="Stop when the queues are empty.")
@click.option("--queues", "queue_names", multiple=True, callback=_queue_names,
              help="Queues to serve (repeatable; default FLEET_QUEUE, else fleet-commands).")
@click.option("--processes", type=click.IntRange(min=1, max=MAX_WORKER_PROCESSES), default=1,
              show_default=True, help="Worker processes to run.")
@json_option
@click.pass_context
def worker(ctx: click.Context, burst: bool, queue_names: tuple[str, ...], processes: int,
           as_json: bool) -> None:
    """Run forking RQ workers on FLEET_REDIS_URL (embedded: drain in-process, then stop).

    It reconciles first. With --processes 1 this process is the worker; with N > 1 it starts N
    `fleetctl worker` processes and supervises them as `up` does (restarts, exit 3 when one keeps
    dying, a bounded stop).

    --burst holds for every process: each drains the queues and exits; this one exits when all
    have, 0 if each did so, else 3 naming each one that failed.

    SIGTERM or SIGINT: a burst run stops and exits 130, leaving the rest queued; a serving run
    stops and exits 0. A lone worker may finish the job in hand (RQ's warm shutdown; a second
    signal cuts it short); supervised ones get FLEET_STOP_GRACE_SECONDS (10 s), then they and
    their work horses are killed, the commands of a job cut short staying in the inbox for
    `fleetctl reconcile`. Never a traceback; no process left behind.
    """
    sweep_seconds()  # checked before anything is opened or runs
    settings, store = settings_and_store()
    _catalog_readable()
    if queue_names:  # what it enqueues (a reconcile, follow-ups) goes to the queues it serves
        settings = dataclasses.replace(settings, queues=queue_names)
    queues = settings.queues
    url = redis_url_in_use(settings)
    if url is not None:
        connection = connect(settings)
        # Refused while another database's workers serve these queues.
        claim(connection, queues, store.log_id())
        if not burst:
            # Before the reconcile: a Redis that loses its data after it is noticed
            # (workers.outage).
            mark_queue(connection, queues[0])
    # A supervised worker's supervisor reconciled before starting it: each of N doing it again
    # had enqueued the whole backlog N more times.
    supervised = url is not None and os.environ.get(SUPERVISOR_ENV) is not None
    reconciled = Submitted([], [], False) if supervised else reconcile_pending(settings, store)
    if url is None:  # its result, on stdout as every result
        announce({"queue": "embedded", "re_enqueued": len(reconciled.accepted_ids),
                  "decided_in_process": True}, as_json,
                 lambda r: f"embedded queue: decided {r['re_enqueued']} pending command(s) "
                           "in-process")
        return
    if as_json:  # the start-up line: one JSON object, before the workers run
        announce({"queue": redacted_url(url), "queues": list(queues), "processes": processes,
                  "burst": burst, "re_enqueued": len(reconciled.accepted_ids)}, as_json=True)
    if processes > 1:  # attached to `up` through its up-file, each follows the file
        _supervise_workers(ctx, processes, url if settings.redis_url is not None else None,
                           queues, burst, settings.stop_grace_seconds)
    elif burst:
        drained = drain(connect(settings), queues)
        if drained.stopped:
            _interrupted(ctx)
        if drained.failed_job_ids:  # out of retries: their commands are still in the inbox
            raise OperationalError(
                f"{len(drained.failed_job_ids)} job(s) failed after every retry (the first: "
                f"{drained.failed_job_ids[0]}; the worker log says why); their commands stay "
                "in the inbox, undecided: `fleetctl reconcile` enqueues them again")
    elif settings.redis_url is None:  # attached to `up` through its up-file: follow the file
        follower = UpFollower(settings, url)
        serve(follower.connect, queues, lambda: reconcile_pending(settings, store),
              inbox_for(settings, store), follower)
    else:  # through a lost Redis: wait for it, reconcile (it may be back empty), go on
        serve(lambda: connect(settings), queues, lambda: reconcile_pending(settings, store),
              inbox_for(settings, store))


def _supervise_workers(ctx: click.Context, count: int, url: str | None, queues: tuple[str, ...],
                       burst: bool, grace_seconds: int) -> None:
    stop = StopSignals()  # before the first child: a signal from now on stops them all
    with WorkerProcesses(url, queues, burst, grace_seconds) as children:
        children.start(count)
        interrupted = children.supervise(stop)
    if interrupted:
        if burst:
            _interrupted(ctx)
        return
    failures = children.failures()
    if failures:
        raise OperationalError(f"{len(failures)} of {count} worker processes failed: "
                               f"{'; '.join(failures)}")


def _interrupted(ctx: click.Context) -> None:
    fail("interrupted before the queues were empty; what is left stays queued (and undecided "
         "commands in the inbox for `fleetctl reconcile`)")
    ctx.exit(130)


def _catalog_readable() -> None:
    """InputError naming FLEET_FIXTURES_DIR unless the model and GPU catalog can be read: a
    worker without it would record each `RegisterModel` by catalog id it decides as rejected
    (`catalog_unreadable`), for good, for a fault of its own machine. Likewise naming
    FLEET_GATEWAY_FIXTURE_DIR when it is set to a path the gateway's fixture provider cannot
    use (every `Dispatch` would fail there)."""
    try:
        load_catalog()
    except CatalogError as error:
        raise InputError(f"{FIXTURES_ENV}: the catalog in {fixtures_dir()} cannot be read "
                         f"({error.message}); a worker needs it to decide RegisterModel") from None
    problem = usable_fixture_dir()
    if problem is not None:
        raise InputError(problem)


def _catalog_readable_if_deciding_here(settings: Settings) -> None:
    """`_catalog_readable` where this process decides (the embedded queue with no `fleetctl
    up`), as a worker is refused; before anything is accepted."""
    if redis_url_in_use(settings) is None:
        _catalog_readable()


@click.command()
@click.option("--port", type=click.IntRange(min=0, max=65_535), default=0,
              help="Loopback port for the embedded Redis (0: any free).")
@click.option("--workers", "worker_count", type=click.IntRange(min=0, max=MAX_WORKER_PROCESSES),
              default=2, show_default=True,
              help="Forking worker processes to run (0: serve the Redis only).")
@json_option
def up(port: int, worker_count: int, as_json: bool) -> None:
    """Serve the embedded fake Redis on a loopback port plus workers, until SIGTERM, SIGINT or
    SIGHUP.

    One `up` per database: while one serves it (holding a lock: a flock on a SQLite file, an
    advisory lock on PostgreSQL), another `up` exits 3 naming its pid (and, on SQLite, the
    up-file beside the database), before it serves anything; a file left by an `up` that is
    gone is replaced. The file is written atomically
    and removed at exit only while it still names this process.

    A worker process that exits is restarted, logged as `worker_restarted` with its exit code,
    0.5 s after it ended, twice as late each time it ends again within a minute of starting; the
    third such exit in a row stops everything and `up` exits 3 naming the worker and its code.

    SIGTERM, SIGINT or SIGHUP: the workers get a warm shutdown (the job in hand may finish) for
    FLEET_STOP_GRACE_SECONDS (10 s), then they and their work horses are killed; the up-file is
    removed and `up` exits 0. A job cut short leaves its commands in the inbox for `fleetctl
    reconcile`. Never a traceback; no process left behind.
    """
    sweep_seconds()  # its workers read it: checked before anything is opened or served
    settings, store = settings_and_store()
    if settings.redis_url is not None:  # submits from here would go there, not to this `up`
        raise InputError(f"FLEET_REDIS_URL is set ({redacted_url(settings.redis_url)}): `up` "
                         "serves a Redis of its own; unset it, or run `fleetctl worker` to serve "
                         "that Redis")
    _catalog_readable()
    up_file = UpFile(settings, store.engine)
    up_file.refuse_if_held()  # again under its lock below, for an `up` starting at the same time
    # Installed before anything is advertised: a SIGTERM that comes as soon as the announcement
    # is read must still stop the workers and remove the up file, not kill this process.
    stop = StopSignals()
    try:
        server = EmbeddedRedisServer(port)
    except OSError as error:
        raise OperationalError(f"cannot serve the embedded Redis on 127.0.0.1:{port}: "
                               f"{error.strerror or error}") from None
    with server:
        # Which database it serves, said before the up-file advertises it (`advertised_up_url`).
        served = dataclasses.replace(settings, redis_url=server.url)
        connection = connect(served)
        connection.set(UP_DATABASE_KEY, up_database(settings))
        with up_file.advertised(server.url), \
                WorkerProcesses(server.url, settings.queues, False,
                                settings.stop_grace_seconds) as children:
            # Once, here: the workers it supervises do not (their queue is new, and empty).
            mark_queue(connection, settings.queues[0])
            reconcile_pending(served, store)
            _serve_up(children, worker_count, up_file, server.url, as_json, stop)


def _serve_up(children: WorkerProcesses, worker_count: int, up_file: UpFile, url: str,
              as_json: bool, stop: StopSignals) -> None:
    """Start `up`'s workers, announce where it serves, and supervise them until stopped."""
    children.start(worker_count)
    path = up_file.path
    # Only a SQLite database has an up-file that `submit` finds by itself.
    reach = ("`fleetctl submit` here reaches them (or export FLEET_REDIS_URL={url})"
             if path is not None else "export FLEET_REDIS_URL={url} for `fleetctl submit` "
             "to reach them")
    announce({"redis_url": url, "workers": worker_count,
              "up_file": None if path is None else str(path)}, as_json,
             lambda r: f"serving the embedded Redis at {r['redis_url']} with "
                       f"{r['workers']} worker(s); " + reach.format(url=r["redis_url"]))
    children.supervise(stop)


@click.command()
@json_option
def reconcile(as_json: bool) -> None:
    """Re-enqueue accepted commands that have no decision (e.g. after Redis lost its queue)."""
    settings, store = settings_and_store()
    _catalog_readable_if_deciding_here(settings)
    result = reconcile_pending(settings, store)
    emit({"re_enqueued": len(result.accepted_ids), "jobs": len(result.job_ids),
          "decided_in_process": result.ran_in_process}, as_json,
         lambda r: f"re-enqueued {r['re_enqueued']} undecided command(s) in {r['jobs']} job(s)")
