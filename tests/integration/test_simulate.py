"""`fleetctl simulate`: figures consistent with the trace and with the run's own log."""

from __future__ import annotations

import csv
import json
import math
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from controlplane.replay import compare_with_live
from controlplane.replay.verify import verify_decisions
from controlplane.runtime import open_store
from events.store import EventStore
from tests.cli_helpers import run_cli

TRACES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
AZURE_CONV = TRACES / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE_CONV = TRACES / "conversation_trace.first5000.jsonl"
SLICE = 300


def simulate(*args: str) -> dict[str, Any]:
    outcome = run_cli("simulate", *args, "--json")
    assert outcome.exit_code == 0, outcome.stderr
    report: dict[str, Any] = json.loads(outcome.output)
    return report


def decided_commands_by_type(store: EventStore) -> Counter[str]:
    """What the log says was decided: commands with a decision event, by command type."""
    types: dict[str, str] = {}
    decided: set[str] = set()
    for event in store.read_all():
        if event.event_type == "CommandAccepted":
            types[event.data["command"]["command_id"]] = event.data["command"]["type"]
        elif event.command_id is not None:
            decided.add(event.command_id)
    return Counter(types[command_id] for command_id in decided)


@pytest.fixture(scope="module")
def azure_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Path]:
    directory = tmp_path_factory.mktemp("azure")
    log, chart = directory / "sim.db", directory / "sim.svg"
    report = simulate(str(AZURE_CONV), "--limit", str(SLICE), "--log", str(log),
                      "--chart", str(chart))
    return report, log, chart


def test_request_count_and_token_totals_equal_the_traces(
        azure_run: tuple[dict[str, Any], Path, Path]) -> None:
    report = azure_run[0]
    with AZURE_CONV.open(newline="") as handle:
        rows = list(csv.reader(handle))[1:SLICE + 1]
    assert report["trace"]["requests"] == report["requests"]["total"] == SLICE
    assert report["trace"]["prompt_tokens"] == sum(int(row[1]) for row in rows)
    assert report["trace"]["output_tokens"] == sum(int(row[2]) for row in rows)
    served = report["requests"]
    assert served["completed"] + served["shed"] + served["unfinished"] == SLICE
    if served["shed"] == 0 and served["unfinished"] == 0:
        assert served["output_tokens_completed"] == report["trace"]["output_tokens"]


def test_decisions_in_the_log_equal_the_decisions_reported(
        azure_run: tuple[dict[str, Any], Path, Path]) -> None:
    report, log, _ = azure_run
    store = open_store(f"sqlite:///{log}")
    in_log = decided_commands_by_type(store)
    assert dict(in_log) == report["decisions"]["by_command"]
    assert sum(in_log.values()) == report["decisions"]["total"]
    assert in_log["AdmitRequest"] == SLICE
    assert in_log["ReleaseRequest"] == report["requests"]["completed"]
    sheds = sum(1 for event in store.read_all() if event.event_type == "RequestShed")
    assert sheds == report["requests"]["shed"]
    store.engine.dispose()


def test_the_logs_state_rebuilds_and_every_decision_rederives(
        azure_run: tuple[dict[str, Any], Path, Path]) -> None:
    store = open_store(f"sqlite:///{azure_run[1]}")
    assert compare_with_live(store) == []
    verified = verify_decisions(store)
    assert verified.identical and verified.decisions_checked >= 2 * SLICE
    store.engine.dispose()


def test_latency_percentiles_are_ordered_and_finite(
        azure_run: tuple[dict[str, Any], Path, Path]) -> None:
    for name, figures in azure_run[0]["latency_seconds"].items():
        p50, p95, p99 = figures["p50"], figures["p95"], figures["p99"]
        assert all(isinstance(v, float) and math.isfinite(v) for v in (p50, p95, p99)), name
        assert 0 <= p50 <= p95 <= p99, name


def test_the_chart_is_valid_svg_with_three_panels(
        azure_run: tuple[dict[str, Any], Path, Path]) -> None:
    root = ElementTree.parse(azure_run[2]).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    titles = [e.text for e in root.iter("{http://www.w3.org/2000/svg}text")]
    assert {"replicas", "queued requests", "latency (seconds)"} <= set(titles)


def test_prefix_aware_routing_saves_prefill_tokens_round_robin_does_not(tmp_path: Path) -> None:
    common = ["--limit", "200", "--replicas", "4", "--no-autoscale", "--no-rollout", "--no-chart"]
    prefix = simulate(str(MOONCAKE_CONV), *common, "--routing", "prefix",
                      "--log", str(tmp_path / "prefix.db"))
    round_robin = simulate(str(MOONCAKE_CONV), *common, "--routing", "round-robin",
                           "--log", str(tmp_path / "rr.db"))
    saved = prefix["prefix_cache"]["saved_prefill_tokens"]
    assert saved > round_robin["prefix_cache"]["saved_prefill_tokens"]
    assert prefix["prefix_cache"]["block_hit_rate"] > round_robin["prefix_cache"]["block_hit_rate"]
    requests = prefix["requests"]["completed"]
    assert prefix["prefix_cache"]["computed_prefill_tokens"] + saved == sum(
        json.loads(line)["input_length"]
        for line in MOONCAKE_CONV.read_text().splitlines()[:200]) and requests == 200


def test_a_missing_trace_exits_2(tmp_path: Path) -> None:
    outcome = run_cli("simulate", str(tmp_path / "nope.csv"), "--log", str(tmp_path / "s.db"))
    assert outcome.exit_code == 2 and "nope.csv" in outcome.stderr


def test_a_malformed_row_exits_2_naming_its_line_and_writes_no_log(tmp_path: Path) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,374,44\n"
                     "2023-11-16 18:15:47.6805900,many,44\n")
    outcome = run_cli("simulate", str(trace), "--log", str(tmp_path / "s.db"))
    assert outcome.exit_code == 2 and "bad.csv:3" in outcome.stderr
    assert "ContextTokens" in outcome.stderr and not (tmp_path / "s.db").exists()


def test_an_existing_log_is_refused_unless_overwritten(tmp_path: Path) -> None:
    log = tmp_path / "s.db"
    log.write_text("")
    args = ["simulate", str(AZURE_CONV), "--limit", "5", "--no-chart", "--log", str(log)]
    assert run_cli(*args).exit_code == 2
    assert run_cli(*args, "--overwrite").exit_code == 0
