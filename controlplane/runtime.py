"""Process-wide wiring: the settings and the event store this process uses."""

from __future__ import annotations

import gc
import os
import sqlite3
from pathlib import Path

from alembic.util.exc import CommandError as AlembicCommandError
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from controlplane.errors import InputError, OperationalError
from controlplane.settings import DEFAULT_DATABASE_URL, Settings, redacted_url
from events.database import ensure_schema, holds_a_log, is_sqlite, make_engine, refused_setting
from events.store import EventStore

_stores: dict[tuple[int, str], EventStore] = {}
# Deciding allocates many short-lived objects (rows, events, decoded JSON) that reference
# counting frees; CPython's default starts a young collection every 700 allocations, and each
# one also walks the projection cache's survivors. Measured on the embedded decision benchmark
# (bench/decisions_bench.py): 15-25% of the time went to collections at the default thresholds.
GC_THRESHOLDS = (50_000, 20, 100)


def collect_garbage_less_often() -> None:
    """Raise the cyclic collector's thresholds for this process (and children it forks).

    Cycles are still collected, only in larger batches; memory held by unreachable cycles is
    bounded by the young-generation threshold.
    """
    if gc.get_threshold()[0] < GC_THRESHOLDS[0]:
        gc.set_threshold(*GC_THRESHOLDS)


def open_store(database_url: str, migrate: bool = True,
               url_source: str = "FLEET_DATABASE_URL", existing: bool = False) -> EventStore:
    """An event store on `database_url`, schema brought up to date unless told otherwise; a bad
    URL is an InputError naming `url_source` (the setting or option it came from). With
    `existing`, a database that holds no log (an empty file, another program's database) is
    an InputError too, found without writing to it: only a command that writes creates a log."""
    try:
        engine = make_engine(database_url)
    except Exception as error:  # sqlalchemy raises ArgumentError, ValueError… for a bad URL
        raise InputError(f"{url_source} is not a usable database URL "
                         f"({type(error).__name__}); use sqlite:///PATH or "
                         "postgresql+psycopg://USER@HOST:PORT/DATABASE") from None
    file = engine.url.database if engine.url.get_backend_name() == "sqlite" else None
    if file and file != ":memory:" and not file.startswith("file:") \
            and not Path(file).parent.is_dir():
        engine.dispose()  # SQLite would say only "unable to open database file" (exit 3)
        raise InputError(f"{url_source}: the directory {Path(file).parent} does not exist")
    if file and Path(file).is_dir():
        engine.dispose()  # SQLite would say "disk I/O error" or "unable to open database file"
        raise InputError(f"{url_source}: {file} is a directory, not a SQLite database file")
    if (existing or migrate) and not is_sqlite(engine):
        _connectable(engine, url_source)
    if existing:
        _holds_a_log(engine, database_url, url_source)
    if migrate:
        try:
            ensure_schema(engine)
        except AlembicCommandError as error:  # a revision this code has no migration for
            engine.dispose()
            raise OperationalError(
                f"cannot open the database: its schema is at a revision this fleetctl does not "
                f"know ({str(error).splitlines()[0]}): a newer fleetctl migrated it; run that "
                "version here too") from None
        except SQLAlchemyError as error:
            raise OperationalError(
                f"cannot open the database: {error.__class__.__name__}: {error.orig}"
                if hasattr(error, "orig") else f"cannot open the database: {error}") from None
    return EventStore(engine)


def _connectable(engine: Engine, url_source: str) -> None:
    """Connect once (the connection stays pooled for what follows): InputError naming
    `url_source` when the URL's connection settings are refused (a port past 65535, an unknown
    option, `sslmode=bogus`), as bad input rather than a database failure; OperationalError
    when the server cannot be reached."""
    port = engine.url.port
    if port is not None and not 0 < port <= 65535:
        engine.dispose()
        raise InputError(f"{url_source} has port {port}; a port is a number from 1 to 65535")
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as error:
        engine.dispose()
        refused = refused_setting(error)
        if refused is not None:
            raise InputError(f"{url_source}: the database driver refuses its settings: "
                             f"{refused}") from None
        raise OperationalError(f"cannot open the database: {error.__class__.__name__}: "
                               f"{getattr(error, 'orig', error)}") from None


def _holds_a_log(engine: Engine, database_url: str, url_source: str) -> None:
    """InputError, the engine disposed, unless the database holds a log."""
    where = engine.url.database if is_sqlite(engine) else redacted_url(database_url)
    try:
        present = holds_a_log(engine)
    except sqlite3.DatabaseError as error:  # not a SQLite file at all
        engine.dispose()
        raise InputError(f"{where} is not a fleet log: {error}") from None
    if not present:
        engine.dispose()
        raise InputError(f"{where} holds no fleet log (no events table): {url_source} "
                         f"(default {DEFAULT_DATABASE_URL}) names the log; `fleetctl init` "
                         "creates one")


def store_for_process(settings: Settings | None = None, existing: bool = False) -> EventStore:
    """The store for this process; a forked child builds its own, never sharing sockets.

    A child forked from a process that already opened the same database (an RQ work horse of a
    `fleetctl worker`) skips the schema check: its parent brought the schema up to date.
    """
    settings = settings or Settings.from_env()
    key = (os.getpid(), settings.database_url)
    if key not in _stores:
        checked = any(url == settings.database_url for _, url in _stores)
        _stores[key] = open_store(settings.database_url, migrate=not checked, existing=existing)
    return _stores[key]
