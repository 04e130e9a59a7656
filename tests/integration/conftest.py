"""Fixtures shared by the integration suites."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.gateway.fixture_provider import FIXTURE_DIR_ENV, FixtureProvider
from controlplane.gateway.scenario import GatewayDriver, common_fixture
from controlplane.replay import compare_with_live
from controlplane.replay.verify import verify_decisions
from controlplane.runtime import open_store
from controlplane.settings import Settings
from events.store import EventStore
from tests.conftest import reset_postgres


@pytest.fixture
def gateway(store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) \
        -> Iterator[GatewayDriver]:
    """The gateway spec's common fixture on an embedded queue; afterwards the log must replay."""
    monkeypatch.setenv(FIXTURE_DIR_ENV, str(tmp_path / "provider"))
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    driver = GatewayDriver(Settings.from_env(), store, FixtureProvider(tmp_path / "provider"))
    driver.run(*common_fixture())
    yield driver
    # Whatever a test did, the log re-derives every decision and rebuilds the same state.
    assert verify_decisions(store).drifts == []
    assert compare_with_live(store) == []


@pytest.fixture
def pg_store(postgres_database: str) -> Iterator[EventStore]:
    """A store on an emptied PostgreSQL log (skipped without `FLEET_TEST_DATABASE_URL`)."""
    reset_postgres(postgres_database)
    store = open_store(postgres_database)
    yield store
    store.engine.dispose()
