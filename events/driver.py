"""The log's hot statements, run on the database driver's own cursor.

A statement through SQLAlchemy Core costs 55 to 115 us of Python on this project's machines
(cache key, compiled parameters, an expanding IN list rendered again, a result object) where
SQLite itself answers in 4 us; a one-command decision runs ten of them. The statements here
are fixed SQL on the log's own tables, written once with `?` marks and an `{in}` slot for an
IN list, and every value is bound by the driver, never formatted into the text.

They run on the connection's current transaction: a write transaction begun by SQLAlchemy
(`BEGIN IMMEDIATE` on SQLite), or, outside one, the driver's own (PostgreSQL opens one that the
pool rolls back on return; SQLite reads in autocommit). A driver error is raised as SQLAlchemy's
matching exception (`OperationalError`, `IntegrityError`...), so callers catch one family.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

Row = tuple[Any, ...]


@lru_cache(maxsize=4096)
def _text(template: str, in_count: int, paramstyle: str) -> str:
    """`template` with `in_count` marks in its `{in}` slot, in the driver's parameter style."""
    sql = template.replace("{in}", ", ".join("?" * in_count)) if in_count else template
    if paramstyle == "qmark":
        return sql
    if paramstyle in ("format", "pyformat"):
        return sql.replace("?", "%s")
    raise ValueError(f"driver parameter style {paramstyle!r} is not supported")


def _run(connection: Connection, template: str, parameters: Sequence[Any], in_count: int,
         many: bool) -> Any:
    sql = _text(template, in_count, connection.dialect.paramstyle)
    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        if many:
            cursor.executemany(sql, parameters)
            return None
        cursor.execute(sql, parameters)
        return cursor.fetchall() if cursor.description is not None else None
    except connection.dialect.loaded_dbapi.Error as error:
        raise DBAPIError.instance(sql, parameters, error,
                                  connection.dialect.loaded_dbapi.Error) from error
    finally:
        cursor.close()


def fetch(connection: Connection, template: str, *parameters: Any,
          in_values: Sequence[Any] = ()) -> list[Row]:
    """The rows a query returns; `in_values` fill its `{in}` slot, after `parameters`."""
    return _run(connection, template, [*parameters, *in_values], len(in_values),  # type: ignore[no-any-return]
                many=False)


def execute(connection: Connection, template: str, *parameters: Any,
            in_values: Sequence[Any] = ()) -> None:
    """Run a statement that returns no rows; `in_values` fill its `{in}` slot."""
    _run(connection, template, [*parameters, *in_values], len(in_values), many=False)


def execute_many(connection: Connection, template: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run a statement once per row of parameters, in one driver call."""
    if rows:
        _run(connection, template, rows, 0, many=True)
