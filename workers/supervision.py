"""Supervising worker processes: the one `fleetctl up` per database (its up-file), the stop
signals a supervisor turns into a clean stop, and `fleetctl worker` processes started, restarted
and stopped within a bounded grace period."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import structlog
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from controlplane.errors import OperationalError
from controlplane.logging import configured_level
from controlplane.settings import Settings
from events.database import is_sqlite
from workers.processes import kill_process_tree
from workers.runner import RECONNECT_FIRST_SECONDS, STABLE_SECONDS, SUPERVISOR_ENV

log = structlog.get_logger(__name__)

# A supervised worker process that exits this many times in a row, each within STABLE_SECONDS
# of its start, is not restarted again: it is failing, not unlucky (a serving worker already
# rides out a Redis outage without exiting).
RESTART_LIMIT = 3
SUPERVISE_POLL_SECONDS = 0.1


class UpFile:
    """The one live `fleetctl up` of a database, and, beside a SQLite database, the up-file where
    it advertises its Redis.

    Which `up` is live is decided by a lock, not by the pid in the file: on SQLite an exclusive
    flock on the database file, on PostgreSQL a session advisory lock (`UP_LOCK_KEYS`, scoped to
    the database) on a connection of its own, named `fleetctl up pid N` in pg_stat_activity.
    Either is held for as long as the `up` serves and dropped when the process ends, however it
    ends (SQLite's own locks are of another kind and do not meet the flock). While another
    process holds it, `advertised` refuses (OperationalError naming that `up`'s pid, and the
    up-file) and writes nothing; a file left by an `up` that is gone is replaced, whatever
    process its pid may name by now. The file is written whole under a temporary name and
    renamed over, so a reader sees all of it or none; an `up` removes it only while it still
    names that `up`. A database in memory: nothing is advertised or locked.
    """

    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        self.path, self.database = settings.up_file, settings.sqlite_path
        # PostgreSQL's lock is taken through the store's engine (SQLite's through the file).
        self.engine = engine if engine is not None and not is_sqlite(engine) else None

    def refuse_if_held(self) -> None:
        """OperationalError naming the pid (and the file) while another live `up` holds it."""
        self._lock()()

    @contextlib.contextmanager
    def advertised(self, url: str) -> Iterator[None]:
        """`url` in the file while the block runs, unless another live `up` holds it."""
        release = self._lock()
        try:
            if self.path is not None:
                self._write({"redis_url": url, "pid": os.getpid()})
            yield
        finally:
            if self.path is not None and self._pid() == os.getpid():
                self.path.unlink(missing_ok=True)
            release()

    def _lock(self) -> Callable[[], None]:
        """Take the lock; returns what releases it. OperationalError when another holds it."""
        if self.engine is not None:
            return _advisory_lock(self.engine)
        if self.path is None or self.database is None:
            return lambda: None
        try:
            lock = os.open(self.database, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            raise OperationalError(f"cannot open the database {self.database} to serve it: "
                                   f"{error.strerror or error}") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            holder = self._pid()
            raise OperationalError(
                f"fleetctl up (pid {holder if holder is not None else 'unknown'}) already "
                f"serves this database: {self.path} names it; stop it, or use another "
                "database") from None
        return lambda: os.close(lock)  # closing the descriptor releases the flock

    def _pid(self) -> int | None:
        if self.path is None:
            return None
        try:
            pid = json.loads(self.path.read_text())["pid"]
        except (OSError, ValueError, KeyError, TypeError):  # absent, unreadable, not ours
            return None
        return pid if isinstance(pid, int) and pid > 0 else None

    def _write(self, content: dict[str, Any]) -> None:
        assert self.path is not None
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            temporary.write_text(json.dumps(content))
            os.replace(temporary, self.path)
        except OSError as error:
            temporary.unlink(missing_ok=True)
            raise OperationalError(f"cannot write the up-file {self.path}: "
                                   f"{error.strerror or error}") from None


# The advisory lock (two 32-bit keys) an `up` on PostgreSQL holds: "fleetctl up" in ASCII.
UP_LOCK_KEYS = (0x666C6565, 0x74757020)
UP_APPLICATION_NAME = "fleetctl up pid {pid}"


def _advisory_lock(engine: Engine) -> Callable[[], None]:
    """Hold PostgreSQL's session advisory lock for `up` on a connection of its own (detached
    from the pool, so no other use of the engine ever holds it); what closes that connection
    releases it. OperationalError naming the holder's pid while another session holds it."""
    try:
        raw = engine.raw_connection()
    except SQLAlchemyError as error:
        raise OperationalError(f"cannot reach the database to serve it: {error}") from None
    raw.detach()
    try:
        cursor = raw.cursor()
        cursor.execute("SELECT set_config('application_name', %s, false)",
                       (UP_APPLICATION_NAME.format(pid=os.getpid()),))
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", UP_LOCK_KEYS)
        row = cursor.fetchone()
        taken = row is not None and row[0] is True
        holder = None if taken else _lock_holder(cursor)
        raw.commit()
    except Exception:
        raw.close()
        raise
    if not taken:
        raw.close()
        raise OperationalError(
            f"fleetctl up (pid {holder or 'unknown'}) already serves this database (it holds "
            "its advisory lock); stop it, or use another database")
    return raw.close


def _lock_holder(cursor: Any) -> str | None:
    """The pid the `up` holding the advisory lock gave in its application name, if it did."""
    cursor.execute(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid = %s "
        "AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_database "
        "WHERE datname = current_database())", UP_LOCK_KEYS)
    row = cursor.fetchone()
    prefix = UP_APPLICATION_NAME.format(pid="")
    if row is None or not str(row[0]).startswith(prefix):
        return None
    return str(row[0]).removeprefix(prefix)


class StopSignals:
    """From construction on, SIGTERM, SIGINT and SIGHUP set `requested` instead of ending the
    process: a supervisor reads it, stops its workers and exits through its clean-up."""

    def __init__(self) -> None:
        self.requested = False
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._request)

    def _request(self, signum: int, frame: object) -> None:
        self.requested = True


def _ended(code: int) -> str:
    """How a process ended, for people: its exit code, or the signal that killed it."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:  # a number no name is given to
        return f"was killed by signal {-code}"


class WorkerProcesses:
    """`fleetctl worker` processes on one Redis, started, watched and stopped by this process.

    Each runs in a process group of its own: only this supervisor signals it (a terminal's
    Ctrl-C reaches it once, through `stop`). Used as a context manager, leaving the block stops
    them all (`stop`), whatever ended it.
    """

    def __init__(self, redis_url: str | None, queues: Sequence[str], burst: bool,
                 grace_seconds: float) -> None:
        """`redis_url` None: each finds (and follows) a `fleetctl up` through its up-file."""
        self._args = [sys.executable, "-m", "controlplane.cli.main", "worker",
                      *(["--burst"] if burst else [])]
        for name in queues:
            self._args += ["--queues", name]
        self._env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}
        if redis_url is not None:
            self._env["FLEET_REDIS_URL"] = redis_url
        level = configured_level()  # `fleetctl --log-level` reaches the workers too
        if level is not None:
            self._env["FLEET_LOG_LEVEL"] = level
        self.burst, self.grace_seconds = burst, grace_seconds
        self.processes: list[subprocess.Popen[bytes]] = []
        self._started: list[float] = []
        self._quick_deaths: list[int] = []
        self._restart_at: list[float | None] = []

    def __enter__(self) -> WorkerProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, count: int) -> None:
        for _ in range(count):
            self.processes.append(self._spawn())
            self._started.append(time.monotonic())
            self._quick_deaths.append(0)
            self._restart_at.append(None)

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self._args, env=self._env, stdin=subprocess.DEVNULL,
                                process_group=0)

    def supervise(self, stop: StopSignals) -> bool:
        """Run until `stop` is requested (True) or, in burst mode, every process has exited
        (False). Serving, a process that exits is restarted (`keep_alive`)."""
        while not stop.requested:
            if self.burst and all(process.poll() is not None for process in self.processes):
                return False
            if not self.burst:
                self.keep_alive()
            time.sleep(SUPERVISE_POLL_SECONDS)
        return True

    def keep_alive(self) -> None:
        """Restart each process that exited, logging `worker_restarted` with its exit code.

        The first restart comes RECONNECT_FIRST_SECONDS after the exit, each further one twice
        as late while the process keeps exiting within STABLE_SECONDS of its start; the
        RESTART_LIMIT-th such exit in a row is not restarted: OperationalError naming the worker
        and how it ended (the caller stops the others on the way out).
        """
        now = time.monotonic()
        for index, process in enumerate(self.processes):
            code = process.poll()
            if code is None:
                continue
            restart_at = self._restart_at[index]
            if restart_at is None:  # an exit not seen before
                quick = now - self._started[index] < STABLE_SECONDS
                deaths = self._quick_deaths[index] + 1 if quick else 1
                self._quick_deaths[index] = deaths
                if deaths >= RESTART_LIMIT:
                    raise OperationalError(
                        f"worker {index + 1} (pid {process.pid}) {_ended(code)}; it ended within "
                        f"{STABLE_SECONDS:g} s of starting {deaths} times in a row, so every "
                        f"worker was stopped")
                self._restart_at[index] = now + RECONNECT_FIRST_SECONDS * 2 ** (deaths - 1)
            elif now >= restart_at:
                self.processes[index] = self._spawn()
                self._started[index], self._restart_at[index] = now, None
                log.warning("worker_restarted", worker=index + 1, pid=self.processes[index].pid,
                            previous_pid=process.pid, exit_code=code,
                            quick_exits_in_a_row=self._quick_deaths[index])

    def failures(self) -> list[str]:
        """Each process that exited other than with 0, for people."""
        return [f"worker {index + 1} (pid {process.pid}) {_ended(process.returncode)}"
                for index, process in enumerate(self.processes)
                if process.returncode not in (None, 0)]

    def stop(self) -> None:
        """Ask every running process to stop (SIGTERM: RQ's warm shutdown, the job in hand may
        finish), wait up to `grace_seconds` for all of them, then kill each one left with its
        work horse (SIGKILL). Never raises; returns once every process has ended."""
        running = [process for process in self.processes if process.poll() is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + self.grace_seconds
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker_killed", pid=process.pid, grace_seconds=self.grace_seconds)
                kill_process_tree(process.pid)  # RQ's horse has a process group of its own
                process.wait()
