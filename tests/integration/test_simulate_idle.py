"""`fleetctl simulate` through idle stretches: cost follows the work, not the trace's time span.

With autoscaling on, the autoscaler observes every interval until its pool rests at
`min_replicas` with nothing queued or arriving; then the clock jumps to the next arrival.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from controlplane.runtime import open_store
from tests.cli_helpers import run_cli

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
FIRST = datetime.fromisoformat("2023-11-16T18:00:00+00:00")


def _two_requests_30_days_apart(tmp_path: Path) -> Path:
    trace = tmp_path / "gap30d.csv"
    trace.write_text(HEADER + "2023-11-16 18:00:00.0,100,10\n2023-12-16 18:00:00.0,100,10\n")
    return trace


def _simulate(*args: str) -> dict[str, Any]:
    outcome = run_cli("simulate", *args, "--no-chart", "--json")
    assert outcome.exit_code == 0, outcome.stderr
    report: dict[str, Any] = json.loads(outcome.output)
    return report


@pytest.mark.timeout(60)  # unbounded ticking would take minutes: fail, not stall
def test_two_requests_30_days_apart_take_seconds_and_few_autoscaler_decisions(
        tmp_path: Path) -> None:
    started = time.perf_counter()
    report = _simulate(str(_two_requests_30_days_apart(tmp_path)), "--log", str(tmp_path / "s.db"))
    assert time.perf_counter() - started < 10
    assert report["requests"]["completed"] == 2
    # A few observations around each request, not one every 15 s for 30 days (172,800).
    assert report["decisions"]["by_command"]["ObserveLoad"] <= 20
    assert report["decisions"]["total"] <= 100


@pytest.mark.timeout(60)
def test_an_idle_stretch_still_scales_down_after_the_stabilisation_window(tmp_path: Path) -> None:
    log = tmp_path / "s.db"
    report = _simulate(str(_two_requests_30_days_apart(tmp_path)), "--replicas", "3",
                       "--min-replicas", "1", "--no-rollout", "--log", str(log))
    assert report["decisions"]["by_command"]["ObserveLoad"] <= 60
    store = open_store(f"sqlite:///{log}")
    scaled = [e for e in store.read_all()
              if e.event_type == "ScaleDecided" and e.data["outcome"] != "hold"]
    store.engine.dispose()
    assert [(e.data["outcome"], e.data["result"]["desired_replicas_after"]) for e in scaled] == [
        ("scale_down", 1)]
    # Down at the first observation after the default 300 s window was covered, not 30 days on.
    seconds_in = (datetime.fromisoformat(scaled[0].occurred_at) - FIRST).total_seconds()
    assert 300 <= seconds_in <= 330
