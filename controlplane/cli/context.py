"""What every subcommand needs: the settings and the store, built once per invocation, and the
option types that bound what a user may ask for."""

from __future__ import annotations

import math
from typing import Any

import click

from controlplane.errors import InputError
from controlplane.runtime import store_for_process
from controlplane.settings import DEFAULT_DATABASE_URL, MAX_JOB_TIMEOUT_SECONDS, Settings
from events.store import EventStore


def settings_and_store() -> tuple[Settings, EventStore]:
    settings = Settings.from_env()
    return settings, store_for_process(settings)


def existing_store() -> EventStore:
    """The store of a command that only reads the log (`status`, `log`, `explain`, `verify`,
    `replay`): a SQLite file that does not exist is refused (InputError) rather than created,
    since a log that is not there is most often one looked for in the wrong directory; nor is
    a log's schema written into a database that holds none (`open_store`'s `existing`)."""
    settings = Settings.from_env()
    path = settings.sqlite_path
    if path is not None and not path.exists():
        raise InputError(f"no log at {path}: FLEET_DATABASE_URL (default {DEFAULT_DATABASE_URL}) "
                         "names the log; run where it is or set the variable")
    return store_for_process(settings, existing=True)


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses NaN, which compares false with any bound and so passes
    click's own checks (a wait of NaN seconds never times out)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return float(number)


# How long a command may wait for decisions: a positive, finite number of seconds, no longer
# than a job may run (FLEET_JOB_TIMEOUT_SECONDS has the same bound).
WAIT_SECONDS = FiniteFloatRange(min=0, min_open=True, max=MAX_JOB_TIMEOUT_SECONDS)
