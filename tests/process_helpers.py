"""Helpers for tests that run `fleetctl` as real processes and watch the processes it starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workers.processes import alive, descendants

ROOT = Path(__file__).resolve().parents[1]
# Worker processes get this long to stop before they are killed (settings.STOP_GRACE_ENV): the
# tests' jobs are held far longer than that.
TEST_GRACE_SECONDS = 2


def fleetctl_environment(sqlite_url: str, **extra: str) -> dict[str, str]:
    """This environment without a Redis or queue of its own, on `sqlite_url`, with a short stop
    grace."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("FLEET_REDIS_URL", "FLEET_QUEUE")}
    return {**environment, "PYTHONPATH": str(ROOT), "FLEET_DATABASE_URL": sqlite_url,
            "FLEET_STOP_GRACE_SECONDS": str(TEST_GRACE_SECONDS), **extra}


def start_fleetctl(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """`fleetctl ARGS` in a session of its own, its output piped."""
    return subprocess.Popen([sys.executable, "-m", "controlplane.cli.main", *args], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    found: list[int] = []
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found.extend(int(child) for child in listing.read_text().split())
        except (OSError, ValueError):
            continue
    return [child for child in found if alive(child)]


def tree(pid: int) -> list[int]:
    """`pid` and every process descended from it."""
    return [pid, *descendants(pid)]


def stop_and_wait(process: subprocess.Popen[str],
                  signum: int = signal.SIGTERM) -> tuple[str, float]:
    """Send `process` `signum` and wait for it: its stderr and the seconds it took to stop,
    once every process of its tree (workers, their work horses) is gone too."""
    processes = tree(process.pid)
    stopping = time.monotonic()
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    stopped_in_seconds = time.monotonic() - stopping
    assert not any(alive(pid) for pid in processes)
    return stderr, stopped_in_seconds


def wait_until(condition: Callable[[], bool], timeout_seconds: float, what: str) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def log_events(stderr: str, name: str) -> list[dict[str, Any]]:
    """The JSON log lines on `stderr` whose event is `name`."""
    events = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == name:
                events.append(event)
    return events
