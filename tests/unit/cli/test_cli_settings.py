"""The settings every `fleetctl` command starts from: bounds a job can carry, URLs shown safely."""

from __future__ import annotations

import pytest

from controlplane.errors import InputError
from controlplane.settings import (
    MAX_BATCH_SIZE,
    MAX_JOB_TIMEOUT_SECONDS,
    Settings,
    redacted_url,
)
from workers.jobs import MAX_IDS_PER_JOB


def test_the_largest_batch_size_is_the_most_ids_a_decide_job_takes() -> None:
    assert MAX_BATCH_SIZE == MAX_IDS_PER_JOB


def test_the_bounds_themselves_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_BATCH_SIZE", str(MAX_BATCH_SIZE))
    monkeypatch.setenv("FLEET_JOB_TIMEOUT_SECONDS", str(MAX_JOB_TIMEOUT_SECONDS))
    settings = Settings.from_env()
    assert (settings.batch_size, settings.job_timeout_seconds) == (10_000, 7 * 24 * 3_600)


@pytest.mark.parametrize(("variable", "value"), [("FLEET_BATCH_SIZE", MAX_BATCH_SIZE + 1),
                                                 ("FLEET_JOB_TIMEOUT_SECONDS", 10**20)])
def test_a_setting_past_its_bound_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                       variable: str, value: int) -> None:
    monkeypatch.setenv(variable, str(value))
    with pytest.raises(InputError, match=f"^{variable} must be at most "):
        Settings.from_env()


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql+psycopg://fleet:hunter2@db.internal:5432/fleet?sslpassword=x",
     "postgresql+psycopg://db.internal:5432/fleet"),
    ("sqlite:///sim.db?password=hunter2", "sqlite:///sim.db"),
    ("sqlite:////tmp/sim.db", "sqlite:////tmp/sim.db"),
    ("redis://:hunter2@127.0.0.1:notaport/0", "redis://127.0.0.1/0"),
    # the database redis-py uses, not 0 (it is not a secret)
    ("redis://:hunter2@127.0.0.1:6379?password=x&db=4", "redis://127.0.0.1:6379?db=4"),
    ("sqlite (temporary)", "sqlite (temporary)")])
def test_a_redacted_url_keeps_where_it_points_and_drops_credentials(url: str, shown: str) -> None:
    assert redacted_url(url) == shown
