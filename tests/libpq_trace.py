"""libpq's protocol trace of PostgreSQL connections, to count the round trips a path costs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy import event as sqlalchemy_event


@contextmanager
def checkouts_traced(engine: Engine, path: Path) -> Iterator[None]:
    """libpq's trace of every connection `engine`'s pool hands out inside the block."""
    traced: list[Any] = []
    with path.open("w") as file:
        def trace(dbapi_connection: Any, *_: Any) -> None:
            dbapi_connection.pgconn.trace(file.fileno())
            traced.append(dbapi_connection)

        sqlalchemy_event.listen(engine, "checkout", trace)
        try:
            yield
        finally:
            sqlalchemy_event.remove(engine, "checkout", trace)
            for dbapi_connection in traced:
                dbapi_connection.pgconn.untrace()


@contextmanager
def protocol_trace(driver_connection: Any, path: Path) -> Iterator[None]:
    """libpq's trace of the messages the connection sends and receives inside the block."""
    with path.open("w") as file:
        driver_connection.pgconn.trace(file.fileno())
        try:
            yield
        finally:
            driver_connection.pgconn.untrace()


def round_trips(trace: str) -> int:
    """How many times the client sent after having received: one per round trip."""
    directions = [line.split("\t")[1] for line in trace.splitlines() if "\t" in line]
    return sum(1 for before, now in zip(["B", *directions], directions, strict=False)
               if before == "B" and now == "F")
