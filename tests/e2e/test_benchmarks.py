"""The benchmarks a newcomer runs (`make bench`) still run, and check what they claim.

Each script runs at a small size in its own process, as `bench/run_all.py` runs it; these
tests check that it finishes, that its own correctness checks held (every command decided
exactly once, replay equal, no GPU held twice) and that it reports the figures the README
table is made of. The numbers themselves are not asserted: at this size they mean nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def run_bench(script: str, *args: str, tmp_path: Path) -> tuple[Any, list[dict[str, Any]]]:
    """Run `bench/<script>` with `--json`; its report and the figures it wrote."""
    figures_path = tmp_path / "figures.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args, "--json",
         "--figures-out", str(figures_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout), json.loads(figures_path.read_text())


def test_decisions_bench_decides_every_command_once_and_reports_its_ratios(tmp_path: Path) -> None:
    report, figures = run_bench("decisions_bench.py", "--commands", "300", "--only", "embedded",
                                tmp_path=tmp_path)
    assert report["failed"] == []
    paths = {(run["path"], run["store"]) for run in report["runs"]}
    assert paths == {("batched", "sqlite+fakeredis"), ("naive", "sqlite+fakeredis")}
    batched = next(run for run in report["runs"] if run["path"] == "batched")
    assert batched["commands"] == 300 and batched["ratio_to_floor"] > 0
    assert [floor["store"] for floor in report["floors"]] == ["sqlite"]
    assert "median of" in report["floors"][0]["note"]
    by_name = {figure["figure"]: figure for figure in figures}
    floor_figure = by_name["decisions/s, sqlite+fakeredis, in-process worker, vs storage floor"]
    assert floor_figure["goal"] == ">= 0.25" and floor_figure["ratio"] > 0


def test_replay_bench_rederives_every_decision_and_reports_memory(tmp_path: Path) -> None:
    report, figures = run_bench("replay_bench.py", "--requests", "300", tmp_path=tmp_path)
    results = report["results"]
    assert results["rebuild"]["count"] == results["floor"]["count"] == report["events"]
    assert results["verify"]["count"] == report["decisions"] and results["verify"]["drifts"] == 0
    assert all(result["peak_rss_mib"] > 0 for result in results.values())
    assert any(figure["figure"].startswith("replay: rebuild") for figure in figures)


def test_placement_log_bench_reserves_each_gpu_once_and_replays_equal(tmp_path: Path) -> None:
    report, figures = run_bench("placement_log_bench.py", "--nodes", "20", "--placements", "40",
                                "--singles", "10", "--arriving", "20", "--pools", "4",
                                tmp_path=tmp_path)
    assert report and report[0]["store"] == "sqlite"
    for result in report:
        assert result["no_gpu_held_twice"] and result["policies_chose_recorded_gpus"]
        assert result["drifts"] == 0 and result["rebuild_equals_live"]
        assert result["gpus_reserved"] > 0 and result["single_median_ms"] > 0
    assert any("one at a time" in figure["figure"] for figure in figures)


def test_bulk_write_bench_stores_every_row_both_ways_on_postgresql(tmp_path: Path) -> None:
    report, figures = run_bench("bulk_write_bench.py", "--commands", "150", "--repeats", "1",
                                tmp_path=tmp_path)
    assert report["event_rows"] > 150 and report["projection_rows"] > 0
    if not os.environ.get("FLEET_TEST_DATABASE_URL"):
        assert "skipped" in report or "results" in report
        return
    assert set(report["results"]) == {"pipelined", "copied"}  # each checked its rows stored
    assert all(result["wall_ms"] > 0 for result in report["results"].values())
    assert len(figures) == 2 and all(figure["reference"] for figure in figures)
