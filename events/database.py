"""The one place that builds database engines and brings the schema to the newest migration."""

from __future__ import annotations

import re
import select
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any, TypeVar
from urllib.request import pathname2url

import structlog
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DisconnectionError

from events import driver

MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Any constant works; every process that migrates PostgreSQL takes the same advisory lock.
PG_MIGRATION_LOCK_KEY = 7_214_553_901
T = TypeVar("T")
# Values bound into one IN (...) list, kept well under every driver's parameter limit.
IN_LIST_SIZE = 500


def in_lists(values: Sequence[T]) -> Iterator[Sequence[T]]:
    """`values` in slices of at most `IN_LIST_SIZE`, one per IN (...) query."""
    for start in range(0, len(values), IN_LIST_SIZE):
        yield values[start:start + IN_LIST_SIZE]


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


# Below this many events a sequential scan is as good as any plan.
MIN_ROWS_FOR_STATISTICS = 1_000
PG_ANALYZE_LOCK_KEY = 7_214_553_902  # one writer at a time analyses; the others go on
_BELIEVED_ROWS_SQL = "SELECT reltuples FROM pg_class WHERE oid = CAST('events' AS regclass)"
_BELIEVED_ROWS = text(_BELIEVED_ROWS_SQL)
log = structlog.get_logger(__name__)


class PlannerStatistics:
    """Keeps PostgreSQL's statistics of the log's tables within a factor of two of their size.

    PostgreSQL plans the log's IN-list reads (a batch's commands, its streams' versions, its
    projection rows) from the tables' statistics. Autovacuum takes them at most once a minute,
    and only once a tenth of a table has changed, so a log that grows fast (a new fleet, a
    benchmark) was read with sequential scans that grew with it: 17 ms instead of 1.8 ms for a
    batch's 500 commands on a 60,000-event log (EXPLAIN ANALYZE), much of it under the append
    lock. After a commit, when the log has more than doubled since the planner last counted it,
    the writer that notices runs ANALYZE: one writer at a time (an advisory lock), skipping a
    table another maintenance job has locked, with short lock and statement timeouts. It is
    only a speed-up, after the write committed: any failure is logged, never raised. SQLite's
    planner needs no statistics here.

    A process learns the planner's count with its first write transaction's reads
    (`count_with`), not on a connection of its own: every RQ work horse is a fresh process,
    and opening a second connection to ask cost each job about as much as deciding 60 commands.
    That read can fail only with the transaction's own (it names no table the log lacks).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.enabled = engine.dialect.name == "postgresql"
        self._believed_rows: float | None = None  # the planner's count, as last read

    def count_with(self, reads: driver.Reads) -> bool:
        """Have `reads` (a write transaction's, sent with its lock) fetch the planner's count of
        the log if this process has not learned it yet; whether it did."""
        if not self.enabled or self._believed_rows is not None:
            return False
        reads.add(_BELIEVED_ROWS_SQL, then=self._counted)
        return True

    def _counted(self, rows: list[driver.Row]) -> None:
        self._believed_rows = float(rows[0][0]) if rows and rows[0][0] is not None else -1.0

    def after_commit(self, log_size: int) -> None:
        if not self.enabled or log_size < MIN_ROWS_FOR_STATISTICS:
            return
        if self._believed_rows is not None and log_size <= 2 * self._believed_rows:
            return
        try:
            self._believed_rows = self._refresh(log_size)
        except Exception as error:  # the commit stands; only the statistics failed
            log.warning("planner_statistics_not_refreshed", error=f"{type(error).__name__}: {error}")
            self._believed_rows = float(log_size)  # try again when the log has doubled

    def _refresh(self, log_size: int) -> float:
        with self.engine.connect() as conn:
            believed = float(conn.execute(_BELIEVED_ROWS).scalar() or -1)  # -1: never analysed
            if believed * 2 >= log_size:
                return believed
            conn.execute(text("SET LOCAL lock_timeout = '200ms'"))
            conn.execute(text("SET LOCAL statement_timeout = '60s'"))
            if conn.execute(text("SELECT pg_try_advisory_xact_lock(:key)"),
                            {"key": PG_ANALYZE_LOCK_KEY}).scalar():
                conn.execute(text("ANALYZE (SKIP_LOCKED) events, projections"))
            conn.commit()
            after = float(conn.execute(_BELIEVED_ROWS).scalar() or -1)
            if after * 2 < log_size:
                log.info("planner_statistics_behind", log_rows=log_size, planner_rows=after,
                         why="another writer is analysing, or this role does not own the tables")
            return max(after, float(log_size))

def make_engine(url: str) -> Engine:
    """An engine for `url`; on SQLite with WAL, a busy timeout and `BEGIN IMMEDIATE` for writers.

    Write transactions are opened with `connection.execution_options(fleet_write=True)`; on
    SQLite they take the database's write lock at BEGIN, so a transaction that reads and then
    appends can never be overtaken between its read and its write.
    """
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _configure_sqlite(engine)
    else:
        # READ COMMITTED whatever the server's default: a decision reads its inbox, then takes
        # the head row's lock in the same transaction, and must see every commit made before it.
        # psycopg prepares no statement of its own: its rollback would deallocate every
        # statement of the session, the log's own too (`events.pg_wire` prepares those).
        engine = create_engine(url, isolation_level="READ COMMITTED",
                               connect_args={"prepare_threshold": None})
        _ping_when_idle(engine)
    _note_failed_statements(engine)
    return engine


def _note_failed_statements(engine: Engine) -> None:
    """Mark a connection whose SQLAlchemy statement failed, as the driver's own statements do,
    so a write transaction that caught the error does not commit (`driver.statement_failed`)."""
    @event.listens_for(engine, "handle_error")
    def _failed(context: Any) -> None:
        # Not while connecting; `note_failure` leaves a lost or closed connection alone.
        if context.connection is not None and not context.is_disconnect:
            driver.note_failure(context.connection)


# A pooled connection idle longer than this is pinged (a round trip) before it is handed out.
PING_AFTER_IDLE_SECONDS = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """Check a pooled PostgreSQL connection before it is handed out, a round trip only if it sat
    idle a while.

    A ping on every checkout (SQLAlchemy's `pool_pre_ping`) was a round trip and a sixth of a
    one-command decision. Instead, a connection back from use a moment ago is checked without
    one: the server writes to an idle connection as it closes it (a restart, a terminated
    backend, an idle timeout), so anything waiting on its socket is taken as lost. It may also
    write a notice or a changed parameter (and notifications, but the log never LISTENs):
    then a sound connection is replaced, which costs only a reconnect. One idle longer than
    `PING_AFTER_IDLE_SECONDS` is pinged, as before, and replaced if the ping fails for any
    reason. A lost one is replaced by a new connection (the pool's `DisconnectionError`).

    Not seen without the ping: a connection lost silently (no packet reached us) within the
    last second, and on a platform without `select.poll` any loss within it; the transaction's
    first statement then fails and the connection is invalidated, as any lost mid-transaction.
    """
    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("idle_since", None)
        if since is None:
            return  # just connected
        if _closing(dbapi_connection):
            raise DisconnectionError("the server closed a pooled connection")
        if time.monotonic() - since >= PING_AFTER_IDLE_SECONDS:
            try:
                engine.dialect.do_ping(dbapi_connection)
            except engine.dialect.loaded_dbapi.Error as error:
                raise DisconnectionError(f"a pooled connection was lost: {error}") from error


def _closing(dbapi_connection: Any) -> bool:
    """Whether the server has written to (or closed) an idle psycopg connection's socket."""
    pgconn = getattr(dbapi_connection, "pgconn", None)
    if pgconn is None or not hasattr(select, "poll"):
        return False
    try:
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN)
        return bool(poller.poll(0))
    except Exception:  # no socket: the connection is already closed
        return True


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Autocommit at the driver level: we issue BEGIN ourselves, with the right lock mode.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        writing = connection.get_execution_options().get("fleet_write", False)
        # On the driver itself: through SQLAlchemy this one statement cost a tenth of a
        # one-command decision.
        driver.begin(connection, "BEGIN IMMEDIATE" if writing else "BEGIN")


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def schema_is_current(engine: Engine) -> bool:
    """True when the database is at the newest migration."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision() == head


# What libpq and psycopg say, before any byte goes to the server, about connection settings they
# refuse: an unknown option, a value out of its set or range (`sslmode=bogus`, port 99999).
_REFUSED_SETTING = re.compile(r'(?:connection is bad: )?(invalid connection option "[^"]*"|'
                              r'invalid \w+ value: .*|invalid port number: .*|'
                              r'invalid integer value .*|bad value for \w+: .*)', re.DOTALL)


def refused_setting(error: Exception) -> str | None:
    """The driver's own words when `error` (from connecting) refuses the URL's connection
    settings rather than reports a server it could not reach; None otherwise."""
    found = _REFUSED_SETTING.fullmatch(str(getattr(error, "orig", error)).strip())
    return None if found is None else found.group(1)


def holds_a_log(engine: Engine) -> bool:
    """Whether the database holds a fleet log (its `events` table), at any revision, read
    without writing anything: a SQLite file is opened read-only (a connection of the engine
    turns on WAL, which writes to the file). sqlite3.DatabaseError for a file that is not one."""
    if is_sqlite(engine):
        location = pathname2url(str(Path(engine.url.database or "").resolve()))
        with closing(sqlite3.connect(f"file:{location}?mode=ro", uri=True)) as connection:
            return connection.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                                      "AND name = 'events'").fetchone() is not None
    with engine.connect() as conn:
        return inspect(conn).has_table("events")


def migrate(engine: Engine) -> None:
    """Upgrade the schema to the newest migration; safe to call from many processes at once."""
    with engine.connect().execution_options(fleet_write=True) as conn, conn.begin():
        if not is_sqlite(engine):
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_MIGRATION_LOCK_KEY})
        command.upgrade(alembic_config(connection=conn), "head")


def ensure_schema(engine: Engine) -> None:
    """Migrate only when needed, so the CLI initialises a fresh database by itself."""
    if not schema_is_current(engine):
        migrate(engine)
