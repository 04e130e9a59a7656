"""The store a process decides with: one per process and database, cheap to open in a work horse."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from controlplane import runtime
from controlplane.errors import OperationalError
from controlplane.runtime import open_store
from controlplane.settings import Settings
from events.database import schema_is_current
from tests.cli_helpers import run_cli


def test_a_forked_work_horse_gets_its_own_store_without_checking_the_schema_again(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_stores", {})
    settings = Settings(database_url=sqlite_url)
    parent = runtime.store_for_process(settings)
    assert schema_is_current(parent.engine)
    assert runtime.store_for_process(settings) is parent
    opened: list[bool] = []
    real_open = runtime.open_store

    def recording_open(url: str, migrate: bool = True,
                       existing: bool = False) -> runtime.EventStore:
        opened.append(migrate)
        return real_open(url, migrate, existing=existing)

    monkeypatch.setattr(runtime, "open_store", recording_open)
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as in a child forked after the parent opened it
    child = runtime.store_for_process(settings)
    assert child is not parent and child.engine is not parent.engine
    assert opened == [False]


def test_the_first_store_of_a_process_brings_the_schema_up_to_date(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_stores", {})
    store = runtime.store_for_process(Settings(database_url=sqlite_url))
    assert schema_is_current(store.engine)


def test_a_database_migrated_by_a_newer_version_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A revision this code has no migration for (a rolling upgrade's newer fleetctl ran
    first): exit 3 naming it, where every command had ended in alembic's traceback."""
    url = f"sqlite:///{tmp_path}/fleet.db"
    open_store(url).engine.dispose()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    engine.dispose()
    with pytest.raises(OperationalError, match="revision this fleetctl does not know .*'0099'"):
        open_store(url)
    monkeypatch.setenv("FLEET_DATABASE_URL", url)
    result = run_cli("status")
    assert result.exit_code == 3 and "'0099'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
