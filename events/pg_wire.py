"""The log's statements on PostgreSQL, sent through libpq's pipeline below psycopg's cursors.

A statement through a psycopg cursor costs 60 to 100 us of Python on this project's machines
(a cursor and its adapters, query conversion, the prepare manager, generators driving the
pipeline, the results set on the cursor) where libpq itself takes about 25; a one-command
decision runs a dozen, so on PostgreSQL that bookkeeping was half of a decision's Python. Here
each batch of statements goes to libpq directly, still through psycopg's own adapters (its
`Transformer`, in C) for parameters and rows:

- every batch is one round trip: libpq's pipeline mode, closed by a sync;
- the transaction's `BEGIN` (with the connection's isolation level, as psycopg writes it)
  rides in the batch of its first statement, where psycopg's cursor sent it alone: one round
  trip fewer per transaction;
- each statement is prepared once per connection and then only bound and executed. The
  server keeps a session's prepared statements whatever becomes of the transaction that
  prepared them; psycopg must not prepare statements of its own on such a connection (the
  engine turns that off: its rollback deallocates every statement of the session, ours too).
  Names carry a random token per connection, so a statement is never mistaken for another
  client's (behind a transaction-mode pooler, turn its prepared-statement support on). At
  most `PREPARED_MAX` are kept per connection; further statements go unprepared. Integers are
  always sent as int8, so one statement keeps one set of parameter types.

Errors: the first statement that fails is raised as psycopg's exception for its SQLSTATE, after
the whole batch has been answered (the server skips what follows a failure in a pipeline, so
nothing after it ran); a prepared statement whose execution failed is prepared afresh next
time (a schema change can invalidate its plan). A lost connection raises psycopg's
`OperationalError`; a batch that did not end cleanly (lost, or interrupted while waiting)
closes its connection. The caller (`events.driver`) turns all of these into SQLAlchemy's.
"""

from __future__ import annotations

import secrets
from collections.abc import Generator, Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.adapt import AdaptersMap, PyFormat, Transformer
from psycopg.types.numeric import Int8BinaryDumper
from psycopg.waiting import Ready, Wait

Row = tuple[Any, ...]
# One statement of a batch: its SQL (with $1, $2... marks), parameters, and whether its rows
# are wanted.
Statement = tuple[bytes, Sequence[Any], bool]

# The transaction's end, sent as is (never prepared).
COMMIT = b"COMMIT"
# Statements kept prepared per connection; the log's statements are a few dozen (the driver
# rounds IN lists up to a power of two), so the bound only guards against the unforeseen.
PREPARED_MAX = 256

_OK = pq.ExecStatus.COMMAND_OK
_TUPLES = pq.ExecStatus.TUPLES_OK
_FAILED = pq.ExecStatus.FATAL_ERROR
_ABORTED = pq.ExecStatus.PIPELINE_ABORTED
_SYNC = pq.ExecStatus.PIPELINE_SYNC
_IDLE = pq.TransactionStatus.IDLE
_BAD = pq.ConnStatus.BAD
_PIPELINE_OFF = pq.PipelineStatus.OFF
_TEXT = pq.Format.TEXT
_AUTO = PyFormat.AUTO
_SQLSTATE = pq.DiagnosticField.SQLSTATE
# SQLSTATE classes of a statement that no longer fits the schema: feature not supported
# ("cached plan must not change result type"), syntax error or access rule violation.
_STALE_CLASSES = (b"0A", b"42")
_BEGIN = object()  # what the BEGIN's answer is, among a batch's expected answers


class _Context:
    """An adaptation context: the connection's adapters, integers always as int8."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection
        self.adapters = AdaptersMap(connection.adapters)
        self.adapters.register_dumper(int, Int8BinaryDumper)


class _Session:
    """What a connection keeps between batches: its adapters and the statements it prepared."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.transformer = Transformer(_Context(connection))
        self.prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self._token = secrets.token_hex(4)
        self._names = 0

    def next_name(self) -> bytes:
        self._names += 1
        return f"fleet_{self._token}_{self._names}".encode()


def _session(connection: psycopg.Connection[Any]) -> _Session:
    """The connection's session, kept on the connection itself: it goes when the connection
    goes (a reconnect is a new connection, with nothing prepared)."""
    session: _Session | None = getattr(connection, "_fleet_wire", None)
    if session is None:
        session = _Session(connection)
        connection._fleet_wire = session  # type: ignore[attr-defined]
    return session


def begin_command(connection: psycopg.Connection[Any]) -> bytes:
    """The `BEGIN` psycopg itself would send on `connection` (its isolation level, read-only
    and deferrable settings, as they are now)."""
    parts = [b"BEGIN"]
    if connection.isolation_level is not None:
        parts += [b"ISOLATION LEVEL",
                  psycopg.IsolationLevel(connection.isolation_level).name.replace("_", " ").encode()]
    if connection.read_only is not None:
        parts.append(b"READ ONLY" if connection.read_only else b"READ WRITE")
    if connection.deferrable is not None:
        parts.append(b"DEFERRABLE" if connection.deferrable else b"NOT DEFERRABLE")
    return b" ".join(parts)


def run(connection: psycopg.Connection[Any], statements: Sequence[Statement]) -> list[list[Row]]:
    """Run `statements` in order, in one round trip, in the connection's transaction (begun
    first if there is none); the rows of each (empty where not wanted). The first failure is
    raised once every statement has been answered. No statement, no round trip.

    On a connection in autocommit (the log never uses one) the batch is one implicit
    transaction up to its sync, as libpq's pipeline makes it: a failure undoes the batch."""
    if not statements:
        return []
    if connection.closed:
        raise psycopg.OperationalError("the connection is closed")
    pgconn = connection.pgconn
    if pgconn.pipeline_status != _PIPELINE_OFF:
        raise psycopg.ProgrammingError("a psycopg pipeline is open on this connection")
    session = _session(connection)
    transformer = session.transformer
    # Every value is dumped before anything is sent: a value psycopg cannot adapt fails here,
    # with nothing sent.
    dumped = []
    for sql, parameters, _ in statements:
        values = transformer.dump_sequence(parameters, [_AUTO] * len(parameters))
        if parameters:
            dumped.append((sql, values, tuple(transformer.types or ()), transformer.formats))
        else:
            dumped.append((sql, values, (), None))
    # What each answer is: _BEGIN, a statement being prepared (its key and name), or a
    # statement's index and the key of the prepared statement it ran (None if unprepared).
    expected: list[Any] = []
    preparing: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
    try:
        pgconn.enter_pipeline_mode()
        if not connection.autocommit and pgconn.transaction_status == _IDLE:
            pgconn.send_query_params(begin_command(connection), None)
            expected.append(_BEGIN)
        for index, (sql, values, types, formats) in enumerate(dumped):
            key = (sql, types)
            name = session.prepared.get(key) or preparing.get(key)
            if name is None and sql != COMMIT and len(session.prepared) < PREPARED_MAX:
                name = preparing[key] = session.next_name()
                pgconn.send_prepare(name, sql, types or None)
                expected.append((key, name))
            if name is None:
                pgconn.send_query_params(sql, values or None, types or None, formats, _TEXT)
                expected.append((index, None))
            else:
                pgconn.send_query_prepared(name, values, formats, _TEXT)
                expected.append((index, key))
        pgconn.pipeline_sync()
        answers = connection.wait(_answers(pgconn, len(expected)))
        pgconn.exit_pipeline_mode()
    except BaseException:
        _abandon(connection)
        raise
    return _rows(session, statements, expected, answers, connection)


def _abandon(connection: psycopg.Connection[Any]) -> None:
    """A batch that did not end cleanly (a lost connection, an interrupt while waiting) may
    have left answers unread or the pipeline open: the connection is closed rather than
    trusted, and whoever holds it finds it lost."""
    if not connection.closed:
        connection.close()


def _answers(pgconn: pq.abc.PGconn,
             count: int) -> Generator[Wait, Ready | int, list[list[pq.abc.PGresult]]]:
    """Send what is queued, then collect each statement's results up to the sync."""
    while pgconn.flush():
        if (yield Wait.RW) & Ready.R:
            pgconn.consume_input()
    answers: list[list[pq.abc.PGresult]] = []
    current: list[pq.abc.PGresult] = []
    while True:
        while pgconn.is_busy():
            yield Wait.R
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            if pgconn.status == _BAD:
                raise psycopg.OperationalError(
                    pgconn.get_error_message() or "the connection to the server was lost")
            answers.append(current)
            current = []
        elif result.status == _SYNC:
            if len(answers) != count:
                raise psycopg.InternalError(
                    f"{len(answers)} answers to a pipeline of {count} statements")
            return answers
        else:
            current.append(result)


def _rows(session: _Session, statements: Sequence[Statement], expected: list[Any],
          answers: list[list[pq.abc.PGresult]],
          connection: psycopg.Connection[Any]) -> list[list[Row]]:
    rows: list[list[Row]] = [[] for _ in statements]
    failure: psycopg.Error | None = None
    transformer = session.transformer
    for what, results in zip(expected, answers, strict=True):
        for result in results:
            status = result.status
            if status == _ABORTED:
                continue
            if status == _FAILED:
                failure = failure or pg_errors.error_from_result(
                    result, encoding=connection.info.encoding)
                if (what is not _BEGIN and type(what[0]) is int and what[1] is not None
                        and (result.error_field(_SQLSTATE) or b"")[:2] in _STALE_CLASSES):
                    # A prepared statement the server can no longer run (a plan a schema
                    # change invalidated, a table gone): prepared afresh next time.
                    session.prepared.pop(what[1], None)
                continue
            if what is _BEGIN:
                continue
            if type(what[0]) is tuple:  # a statement now prepared on this connection
                session.prepared[what[0]] = what[1]
            elif statements[what[0]][2] and status == _TUPLES:
                transformer.set_pgresult(result)
                rows[what[0]] = transformer.load_rows(0, result.ntuples, tuple)
            elif status not in (_OK, _TUPLES):
                failure = failure or psycopg.InternalError(
                    f"unexpected answer {pq.ExecStatus(status).name} from the server")
    if failure is not None:
        if isinstance(failure, pg_errors.InvalidSqlStatementName):
            # The session lost its prepared statements (DISCARD ALL, a pooler in front):
            # prepare afresh from the next batch on.
            session.prepared.clear()
        raise failure
    return rows
