"""`fleetctl` as its own process: signals, a closed standard input, a long-running command's
start-up line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controlplane.runtime import open_store
from controlplane.service import pending_command_ids
from tests.cli_helpers import run_cli
from tests.factories import assess_memory

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = 3_000


def _environment(sqlite_url: str, **extra: str) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("FLEET_REDIS_URL", "FLEET_QUEUE")}
    return {**environment, "PYTHONPATH": str(ROOT), "FLEET_DATABASE_URL": sqlite_url, **extra}


def _fleetctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "controlplane.cli.main", *args]


def _with_default_stop_signals() -> None:
    # A shell starts background jobs with SIGINT ignored; a user's terminal does not.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_embedded_submit_exits_130_in_one_line_and_leaves_the_rest_for_reconcile(
        tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
        stop: signal.Signals) -> None:
    # RQ's in-process worker kept the signals: a traceback (StopRequested) and exit 1, or a
    # hang when its handler called the fake Redis from inside a call to it.
    source = tmp_path / "commands.jsonl"
    source.write_text("\n".join(json.dumps(assess_memory(f"c{i}")) for i in range(COMMANDS)))
    store = open_store(sqlite_url)
    process = subprocess.Popen(
        _fleetctl("submit", str(source)), env=_environment(sqlite_url, FLEET_BATCH_SIZE="10"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_with_default_stop_signals)
    try:
        deadline = time.monotonic() + 60
        while not (store.head()[0] >= COMMANDS and len(pending_command_ids(store)) < COMMANDS):
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.02)
        process.send_signal(stop)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 130, stderr
    assert stderr.startswith("error: interrupted") and len(stderr.splitlines()) == 1, stderr
    left = len(pending_command_ids(store))
    assert 0 < left < COMMANDS  # it stopped, and every command is in the inbox
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    reconciled = run_cli("reconcile", "--json")
    assert reconciled.exit_code == 0, reconciled.stderr
    assert json.loads(reconciled.output)["re_enqueued"] == left
    assert pending_command_ids(store) == []
    store.engine.dispose()


def test_submit_with_standard_input_closed_is_a_one_line_usage_error(sqlite_url: str) -> None:
    completed = subprocess.run(
        ["/bin/sh", "-c", 'exec "$@" <&-', "sh", *_fleetctl("submit", "-")],
        env=_environment(sqlite_url), capture_output=True, text=True, timeout=60, check=False)
    assert completed.returncode == 2
    assert completed.stderr == "error: cannot read standard input: it is closed\n"


def test_up_announces_itself_as_one_json_line_and_a_sigterm_right_after_stops_it_cleanly(
        sqlite_url: str) -> None:
    """The SIGTERM handler is in place before the announcement: terminated as soon as the line
    is read, `up` exits 0 and removes its up file (it had died of the signal, leaving the file
    advertising a Redis that was gone)."""
    process = subprocess.Popen(_fleetctl("up", "--workers", "0", "--json"),
                               env=_environment(sqlite_url), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        started = json.loads(process.stdout.readline())
        assert started["redis_url"].startswith("redis://127.0.0.1:")
        assert started["workers"] == 0
        assert started["up_file"] == sqlite_url.removeprefix("sqlite:///") + ".up.json"
    finally:
        process.terminate()
        process.communicate(timeout=30)
    assert process.returncode == 0
    assert not Path(started["up_file"]).exists()
