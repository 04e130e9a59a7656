"""`fleetctl up` serves the embedded Redis on loopback; `submit` in another process reaches it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.factories import assess_memory

pytestmark = pytest.mark.slow


def fleetctl(*args: str, env: dict[str, str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlplane.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=120, **kwargs)  # type: ignore[call-overload]


def test_submit_from_another_process_is_decided_by_the_up_workers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLEET_REDIS_URL"}
    env["FLEET_DATABASE_URL"] = f"sqlite:///{tmp_path}/fleet.db"
    up = subprocess.Popen([sys.executable, "-m", "controlplane.cli.main", "up", "--workers", "2"],
                          env=env, cwd=tmp_path, start_new_session=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        up_file = tmp_path / "fleet.db.up.json"
        deadline = time.monotonic() + 60
        while not up_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert up_file.exists(), "fleetctl up never advertised its Redis"
        commands = tmp_path / "commands.jsonl"
        commands.write_text("\n".join(json.dumps(assess_memory(f"u{i}")) for i in range(30)))
        result = fleetctl("submit", str(commands), "--wait", "--json", env=env)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["decided_in_process"] is False  # the up workers decided them
        assert len(report["decisions"]) == 30
        assert {d["outcome"] for d in report["decisions"]} == {"fits"}
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(timeout=30)
    assert not (tmp_path / "fleet.db.up.json").exists(), "up left its advertisement behind"
