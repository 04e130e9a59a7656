"""What every subcommand needs: the settings and the store, built once per invocation."""

from __future__ import annotations

from controlplane.runtime import store_for_process
from controlplane.settings import Settings
from events.store import EventStore


def settings_and_store() -> tuple[Settings, EventStore]:
    settings = Settings.from_env()
    return settings, store_for_process(settings)
