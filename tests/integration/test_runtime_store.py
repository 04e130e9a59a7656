"""The store a process decides with: one per process and database, cheap to open in a work horse."""

from __future__ import annotations

import os

import pytest

from controlplane import runtime
from controlplane.settings import Settings
from events.database import schema_is_current


def test_a_forked_work_horse_gets_its_own_store_without_checking_the_schema_again(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_stores", {})
    settings = Settings(database_url=sqlite_url)
    parent = runtime.store_for_process(settings)
    assert schema_is_current(parent.engine)
    assert runtime.store_for_process(settings) is parent
    opened: list[bool] = []
    real_open = runtime.open_store

    def recording_open(url: str, migrate: bool = True) -> runtime.EventStore:
        opened.append(migrate)
        return real_open(url, migrate)

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
