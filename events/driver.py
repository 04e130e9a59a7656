"""The log's hot statements, run on the database driver's own cursor.

A statement through SQLAlchemy Core costs 55 to 115 us of Python on this project's machines
(cache key, compiled parameters, an expanding IN list rendered again, a result object) where
SQLite itself answers in 4 us; a one-command decision runs ten of them. The statements here
are fixed SQL on the log's own tables, written once with `?` marks and an `{in}` slot for an
IN list, and every value is bound by the driver, never formatted into the text.

On SQLite they run on the driver's cursor; on PostgreSQL through libpq directly
(`events.pg_wire`: psycopg's cursor cost more Python than the rest of a one-command decision's
statements together), each batch in one round trip, each statement prepared once per connection.

They run in the connection's transaction, begun through SQLAlchemy as its own statements would
autobegin one (on SQLite `BEGIN`, or `BEGIN IMMEDIATE` for a writer, issued by `begin` below;
on PostgreSQL psycopg's `BEGIN`, sent with the transaction's first statements),
so on SQLite the reads of one connection share a snapshot (PostgreSQL runs at READ COMMITTED:
each statement sees what was committed before it), and the pool rolls back what a reader leaves. A
driver error is raised as SQLAlchemy's matching exception (`OperationalError`,
`IntegrityError`...), so callers catch one family; a lost connection is invalidated, as
SQLAlchemy would.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, ProgrammingError

from events import pg_wire
from events.model import StatementFailed

Row = pg_wire.Row


@lru_cache(maxsize=4096)
def _text(template: str, in_count: int, paramstyle: str) -> str:
    """`template` with `in_count` marks in its `{in}` slot, in the driver's parameter style."""
    sql = template.replace("{in}", ", ".join("?" * in_count)) if in_count else template
    if paramstyle == "qmark":
        return sql
    if paramstyle in ("format", "pyformat"):
        return sql.replace("?", "%s")
    if paramstyle == "numeric_dollar":  # libpq's own marks (`pg_wire`)
        pieces = sql.split("?")
        return "".join(f"{piece}${n}" for n, piece in enumerate(pieces[:-1], 1)) + pieces[-1]
    raise ValueError(f"driver parameter style {paramstyle!r} is not supported")


# Set in a connection's info when one of its statements fails (`statement_failed`).
_FAILED = "fleet_statement_failed"


def statement_failed(connection: Connection) -> bool:
    """Whether a statement failed on `connection` since `forget_failures` (a driver statement,
    or a SQLAlchemy one: `database.make_engine` reports those)."""
    return bool(connection.info.get(_FAILED))


def forget_failures(connection: Connection) -> None:
    """Start counting failed statements afresh (a write transaction begins)."""
    connection.info.pop(_FAILED, None)


def note_failure(connection: Connection) -> None:
    """Mark `connection` as having had a statement fail. A lost or closed one is left alone:
    reading its info would reconnect it (and it can commit nothing anyway)."""
    if not (connection.closed or connection.invalidated):
        connection.info[_FAILED] = True


@contextmanager
def _as_sqlalchemy_errors(connection: Connection, sql: str, parameters: Any,
                          cursor: Any = None) -> Iterator[None]:
    dbapi = connection.dialect.loaded_dbapi
    try:
        yield
    except dbapi.Error as error:
        lost = connection.dialect.is_disconnect(error, connection.connection.dbapi_connection,
                                                cursor)
        if lost:
            connection.invalidate(error)
        else:
            note_failure(connection)
        raise DBAPIError.instance(sql, parameters, error, dbapi.Error,
                                  connection_invalidated=lost) from error
    except Exception:  # not the database's (sqlite3 refusing an integer past 64 bits mid-batch)
        note_failure(connection)
        raise
    except BaseException:  # an interrupt: a connection the statement had to close is dropped
        if getattr(connection.connection.driver_connection, "closed", False) is True:
            connection.invalidate()
        raise


def begin(connection: Connection, statement: str) -> None:
    """Issue SQLite's `BEGIN` (or `BEGIN IMMEDIATE`) on the driver, from SQLAlchemy's `begin`
    event: a lock that cannot be had in the busy timeout is SQLAlchemy's `OperationalError`."""
    with _as_sqlalchemy_errors(connection, statement, ()):
        connection.connection.driver_connection.execute(statement)  # type: ignore[union-attr]


def _begun(connection: Connection) -> Any:
    """The driver's connection, in the transaction a SQLAlchemy statement would autobegin.

    In a write transaction (`fleet_write`) in which a statement failed, no further statement
    runs (StatementFailed): some SQLite errors (an interrupt, a full disk, busy) roll back the
    whole transaction, and what ran after them would be stored at once, outside it."""
    if not connection.in_transaction():
        connection.begin()
    elif statement_failed(connection) and connection.get_execution_options().get("fleet_write"):
        raise StatementFailed("a statement of this write transaction failed: it runs no further"
                              " statement, and is rolled back")
    return connection.connection.driver_connection


def _run(connection: Connection, template: str, parameters: Sequence[Any], in_count: int,
         mode: str) -> Any:
    """Run the statement: `mode` "rows" returns its rows, "none" nothing, "many" runs it once per
    row of `parameters` (inside `pipeline`, "none" and "many" do not wait for the server)."""
    if gathers(connection):
        return _run_wired(connection, template, parameters, in_count, mode)
    sql = _text(template, in_count, connection.dialect.paramstyle)
    driver_connection = _begun(connection)
    cursor = driver_connection.cursor()
    try:
        with _as_sqlalchemy_errors(connection, sql, parameters, cursor):
            if mode == "many":
                cursor.executemany(sql, parameters)
                return None
            cursor.execute(sql, parameters)
            if mode != "rows":
                return None
            try:
                return cursor.fetchall()
            except sqlite3.OperationalError as error:
                if not str(error).startswith(_NOT_UTF8):
                    raise
            return _leniently_decoded(driver_connection, sql, parameters)
    finally:
        cursor.close()


# What sqlite3 says of a text value that is not UTF-8, which only an edit outside the log stores.
_NOT_UTF8 = "Could not decode to UTF-8"


def _leniently_decoded(driver_connection: sqlite3.Connection, sql: str,
                       parameters: Sequence[Any]) -> list[Any]:
    """The rows again, with U+FFFD for each byte of text that is not UTF-8: sqlite3 had stopped
    the whole read (every row of the chunk) naming none; this way the row's parse or its hash
    check names it. Only after that error: the usual decoding is sqlite3's own, in C."""
    previous = driver_connection.text_factory
    driver_connection.text_factory = lambda raw: raw.decode("utf-8", "replace")
    cursor = driver_connection.cursor()
    try:
        cursor.execute(sql, parameters)
        return cursor.fetchall()
    finally:
        cursor.close()
        driver_connection.text_factory = previous


def gathers(connection: Connection) -> bool:
    """Whether the connection's statements go through libpq directly (`events.pg_wire`:
    PostgreSQL through psycopg, whose libpq has pipeline mode), so that `Reads` and `pipeline`
    send theirs in one round trip rather than one by one."""
    return connection.dialect.driver == "psycopg" and _psycopg_pipelines()


def _wire_statement(template: str, parameters: Sequence[Any], in_count: int,
                    rows: bool) -> pg_wire.Statement:
    """The statement in libpq's marks, its IN list (the last `in_count` parameters) padded to
    a power of two by repeating its last value (the same rows match), so each template has a
    few sizes and so a few prepared statements per connection, not one per length."""
    if in_count > 1:
        size = 1 << (in_count - 1).bit_length()
        if size != in_count:
            parameters = [*parameters, *[parameters[-1]] * (size - in_count)]
            in_count = size
    return _wire_text(template, in_count), parameters, rows


@lru_cache(maxsize=4096)
def _wire_text(template: str, in_count: int) -> bytes:
    return _text(template, in_count, "numeric_dollar").encode()


# Statements a `pipeline` block has queued on a wired connection, not yet sent.
_QUEUED: WeakKeyDictionary[Any, list[pg_wire.Statement]] = WeakKeyDictionary()


def _run_wired(connection: Connection, template: str, parameters: Sequence[Any], in_count: int,
               mode: str) -> Any:
    if mode == "many":
        statements = [_wire_statement(template, row, 0, False) for row in parameters]
    else:
        statements = [_wire_statement(template, parameters, in_count, mode == "rows")]
    queued = _QUEUED.get(_begun(connection))
    if queued is not None and mode != "rows":
        queued.extend(statements)
        return None
    answers = _pipelined(connection, statements, template, parameters)
    return answers[-1] if mode == "rows" else None


def _pipelined(connection: Connection, statements: list[pg_wire.Statement],
               label: str = "(pipelined statements)", parameters: Any = ()) -> list[list[Row]]:
    """Every statement of a wired connection goes to the server here, after those a `pipeline`
    block holds (so they run in the order they were issued), in one round trip; returns the
    rows of `statements`. An error is SQLAlchemy's, named `label` (a lone statement's SQL)."""
    driver_connection = _begun(connection)
    queued = _QUEUED.get(driver_connection)
    held = 0
    if queued:
        held = len(queued)
        statements, queued[:] = [*queued, *statements], []
    with _as_sqlalchemy_errors(connection, label, parameters):
        return pg_wire.run(driver_connection, statements)[held:]


@lru_cache(maxsize=1)
def _psycopg_pipelines() -> bool:
    """psycopg's pipeline mode needs libpq 14 or later (its binary wheel bundles one)."""
    from psycopg import Pipeline
    return bool(Pipeline.is_supported())


@contextmanager
def pipeline(connection: Connection, commit: bool = False) -> Iterator[None]:
    """Send the statements run inside (`execute`, `execute_many`) without waiting for each.

    On PostgreSQL they are held until the block ends and then go in one round trip (a `fetch`,
    `Reads` or COPY inside the block sends them first, so everything runs in the order it was
    issued); an error any of them meets is raised there, as SQLAlchemy's exception; the
    transaction has then failed, as after any error. A block left by an exception sends
    nothing it held, and marks the connection failed (`statement_failed`): a write transaction
    that caught the exception still refuses to commit. Not for SQLAlchemy's own statements,
    which would overtake what the block holds. On SQLite, which has no round trips, each runs
    as it is issued.

    `commit`: where the statements are pipelined, the transaction's COMMIT goes last in the
    same round trip, so a block that ends without an error has committed (the caller's own
    commit then finds nothing left to do), and one that fails has committed nothing (PostgreSQL
    skips what follows an error in a pipeline). Elsewhere the caller's commit does it, as usual.
    """
    if not gathers(connection):
        yield
        return
    driver_connection = _begun(connection)
    if driver_connection in _QUEUED:
        raise RuntimeError("driver.pipeline blocks do not nest")
    queued = _QUEUED[driver_connection] = []
    try:
        yield
    except BaseException:
        if queued:  # writes the caller issued are dropped: the transaction must not commit
            note_failure(connection)
        raise
    else:
        _pipelined(connection, [(pg_wire.COMMIT, (), False)] if commit else [])
    finally:
        del _QUEUED[driver_connection]


# Fewer rows than this go with a transaction's other writes in its one pipelined round trip; a
# batch this large is loaded by COPY first (PostgreSQL): a tenth of executemany's client time.
COPY_MIN_ROWS = 100


def can_copy(connection: Connection) -> bool:
    """Whether `copy_rows` can bulk-load on this connection (psycopg's COPY)."""
    return connection.dialect.driver == "psycopg"


_STAGES: WeakKeyDictionary[Engine, bool] = WeakKeyDictionary()


def can_stage(connection: Connection) -> bool:
    """Whether `copy_upsert` can stage rows on this connection: COPY, and the database lets
    the role create temporary tables (asked once per engine, and again after a refusal)."""
    if not can_copy(connection):
        return False
    allowed = _STAGES.get(connection.engine)
    if allowed is None:
        ((granted,),) = fetch(connection, "SELECT has_database_privilege(current_database(),"
                                          " 'TEMPORARY')")
        allowed = _STAGES[connection.engine] = bool(granted)
    return allowed


def copy_rows(connection: Connection, table: str, columns: Sequence[str],
              rows: Sequence[Sequence[Any]]) -> None:
    """Load `rows` (values in `columns` order) into `table` with one COPY, in the connection's
    transaction; a constraint it breaks is SQLAlchemy's error, as for an INSERT.

    `table` and `columns` are the caller's own names, never input. PostgreSQL only (`can_copy`).
    Inside `pipeline`, what the block holds is sent first (a round trip): COPY is a round trip
    of its own.
    """
    sql = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
    if _QUEUED.get(_begun(connection)):
        _pipelined(connection, [])  # what a `pipeline` block holds runs first, in order
    cursor = _begun(connection).cursor()
    try:
        with _as_sqlalchemy_errors(connection, sql, (), cursor), cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row(row)
    finally:
        cursor.close()


def copy_upsert(connection: Connection, table: str, columns: Sequence[str], conflict: str,
                rows: Sequence[Sequence[Any]]) -> None:
    """Insert `rows` into `table`, a row whose `conflict` key (a comma-separated column list)
    is stored already replacing that row's other columns: COPY into a temporary staging table
    like `table`, then one INSERT ... ON CONFLICT from it that also empties it.

    The rows' keys must be distinct. Only where `can_stage`. The
    staging table is the session's own and empty between transactions (truncated at commit:
    autovacuum never visits temporary tables, so deleted rows would stay in its pages).
    """
    staging = f"pg_temp.{table}_staged"
    keys = {name.strip() for name in conflict.split(",")}
    names = ", ".join(columns)
    updates = ", ".join(f"{name} = excluded.{name}" for name in columns if name not in keys)
    try:
        _run(connection, f"CREATE TEMPORARY TABLE IF NOT EXISTS {staging} (LIKE {table})"
                         " ON COMMIT DELETE ROWS", [], 0, "none")
        copy_rows(connection, staging, columns, rows)
    except ProgrammingError:  # e.g. TEMPORARY revoked since it was asked: ask again next time
        _STAGES.pop(connection.engine, None)
        raise
    # The INSERT takes (deletes) every staged row, so a second upsert in the transaction works.
    _run(connection, f"WITH staged AS (DELETE FROM {staging} RETURNING {names})"
                     f" INSERT INTO {table} ({names}) SELECT {names} FROM staged"
                     f" ON CONFLICT ({conflict}) DO UPDATE SET {updates}", [], 0, "none")


def fetch(connection: Connection, template: str, *parameters: Any,
          in_values: Sequence[Any] = ()) -> list[Row]:
    """The rows a query returns; `in_values` fill its `{in}` slot, after `parameters`."""
    return _run(connection, template, [*parameters, *in_values], len(in_values),  # type: ignore[no-any-return]
                "rows")


def execute(connection: Connection, template: str, *parameters: Any,
            in_values: Sequence[Any] = ()) -> None:
    """Run a statement that returns no rows; `in_values` fill its `{in}` slot."""
    _run(connection, template, [*parameters, *in_values], len(in_values), "none")


def execute_many(connection: Connection, template: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run a statement once per row of parameters, in one driver call."""
    if rows:
        _run(connection, template, rows, 0, "many")


class Reads:
    """Queries gathered to run together, each one's rows handed to the function given with it.

    On PostgreSQL they go in one round trip (`events.pg_wire`), on SQLite one after the
    other. Each runs in the connection's transaction; an error any of them meets is raised as
    SQLAlchemy's exception and no function is called.
    """

    def __init__(self) -> None:
        self._queries: list[tuple[str, list[Any], int, Callable[[list[Row]], None]]] = []

    def add(self, template: str, *parameters: Any, in_values: Sequence[Any] = (),
            then: Callable[[list[Row]], None]) -> None:
        """Read `template` (see `fetch`) when the reads run, and call `then` with its rows."""
        self._queries.append((template, [*parameters, *in_values], len(in_values), then))

    def run(self, connection: Connection) -> None:
        """Run every query gathered (then forget them), in order, and hand each its rows."""
        queries, self._queries = self._queries, []
        if gathers(connection):
            results = _pipelined(connection, [_wire_statement(template, parameters, in_count, True)
                                              for template, parameters, in_count, _ in queries],
                                 "(pipelined queries)")
        else:
            results = [_run(connection, template, parameters, in_count, "rows")
                       for template, parameters, in_count, _ in queries]
        for (*_, then), rows in zip(queries, results, strict=True):
            then(rows)
