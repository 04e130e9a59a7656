"""`fleetctl simulate` refuses bad input before its log exists: exit 2, one line, no log file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli

TRACES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
AZURE_CONV = TRACES / "AzureLLMInferenceTrace_conv.csv"
SMALL = ["--limit", "3", "--no-chart", "--no-autoscale", "--no-rollout"]


def _mooncake(path: Path, *stamps_ms: float) -> Path:
    path.write_text("".join(json.dumps({"timestamp": stamp, "input_length": 100,
                                        "output_length": 5, "hash_ids": [1]}) + "\n"
                            for stamp in stamps_ms))
    return path


@pytest.mark.parametrize(("option", "value"), [("--model", "nosuch"), ("--gpu", "nosuch")])
def test_an_unknown_catalog_model_or_gpu_exits_2_and_leaves_no_log(
        tmp_path: Path, option: str, value: str) -> None:
    log = tmp_path / "sim.db"
    refused = run_cli("simulate", str(AZURE_CONV), *SMALL, option, value, "--log", str(log))
    assert refused.exit_code == 2 and option in refused.stderr
    assert not log.exists() and not Path(f"{log}-wal").exists()
    # Nothing was left behind to refuse the corrected run.
    assert run_cli("simulate", str(AZURE_CONV), *SMALL, "--log", str(log)).exit_code == 0


@pytest.mark.parametrize(("name", "rows", "line"), [
    ("far.jsonl", [300_000_000_000_000], 1),
    ("huge.jsonl", [0, 1e20], 2),
    ("max.csv", ["9999-12-31 23:59:59.9999999"], 2),
])
def test_a_trace_time_out_of_range_exits_2_naming_its_line_and_leaves_no_log(
        tmp_path: Path, name: str, rows: list[object], line: int) -> None:
    trace = tmp_path / name
    if name.endswith(".csv"):
        trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                         + "".join(f"{row},100,10\n" for row in rows))
    else:
        _mooncake(trace, *[float(row) for row in rows if isinstance(row, (int, float))])
    log = tmp_path / "sim.db"
    outcome = run_cli("simulate", str(trace), "--no-chart", "--log", str(log))
    assert outcome.exit_code == 2 and f"{name}:{line}" in outcome.stderr
    assert "Traceback" not in outcome.stderr and not log.exists()


def test_a_speedup_stretching_the_trace_past_ten_years_exits_2_and_leaves_no_log(
        tmp_path: Path) -> None:
    trace = _mooncake(tmp_path / "day.jsonl", 0, 86_400_000)
    log = tmp_path / "sim.db"
    outcome = run_cli("simulate", str(trace), "--no-chart", "--speedup", "1e-9", "--log", str(log))
    assert outcome.exit_code == 2 and "--speedup" in outcome.stderr and not log.exists()


def test_a_log_in_a_missing_directory_exits_2_not_3(tmp_path: Path) -> None:
    log = tmp_path / "missing" / "sim.db"
    outcome = run_cli("simulate", str(AZURE_CONV), *SMALL, "--log", str(log))
    assert outcome.exit_code == 2 and "--log" in outcome.stderr and not log.parent.exists()
