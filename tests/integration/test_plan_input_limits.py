"""`fleetctl plan` at the edges of its input: every bad scenario exits 2 with one line naming the
field and writes nothing; a plan over its limits is a decision that lists each violation once,
and a log recorded under the rules that listed them twice replays as an upgrade, not a fault."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from controlplane import handlers
from controlplane.handlers import plan as plan_handlers
from controlplane.policies.fleet_plan_scenario import MAX_SCENARIO_BYTES
from controlplane.policies.fleet_plan_stages import stage_verdict
from controlplane.runtime import open_store
from tests.cli_helpers import run_cli

SCENARIOS = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"


@pytest.fixture
def embedded(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    return sqlite_url


def scenario_file(directory: Path, path: str, value: object) -> Path:
    plain: dict[str, Any] = json.loads((SCENARIOS / "default.json").read_text("utf-8"))
    *parents, last = path.split(".")
    node: Any = plain
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value
    source = directory / "scenario.json"
    source.write_text(json.dumps(plain, indent=2), encoding="utf-8")
    return source


@pytest.mark.parametrize("where", ["plan", "replay"])
def test_a_file_with_a_lone_surrogate_escape_exits_2_with_one_line_and_writes_nothing(
        embedded: str, tmp_path: Path, where: str) -> None:
    """`\\ud800` loads as a string no UTF-8 can hold: `plan` printed a traceback (exit 1)
    where the scenario was first encoded; a what-if file is read the same way."""
    if where == "plan":
        source = scenario_file(tmp_path, "description", "lone \ud800 surrogate")
        result = run_cli("plan", str(source), "--output", str(tmp_path / "fleet-plan.json"))
    else:
        source = tmp_path / "policy.json"
        source.write_text('{"admission": {"max_queued_requests": 1, "note\\ud800": 1}}')
        result = run_cli("replay", "--policy", str(source))
    assert result.exit_code == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert "lone surrogate" in line and str(source) in line
    assert open_store(embedded).head()[0] == 0


@pytest.mark.parametrize(("path", "value", "field", "words"), [
    # Regression (2a): PlanFleet refused it after the parser passed it: a traceback, exit 1.
    ("description", "x" * 1_000_000, "description", f"limit of {MAX_SCENARIO_BYTES} bytes"),
    # Regression (2b): the scaling stage's ready capacity overflowed: a traceback, exit 1.
    ("workloads.1.mean_service_seconds", 1e307, "workloads[1].mean_service_seconds",
     "out of numeric range"),
    # Regression (5): no bound, and a divisor scan that took minutes.
    ("topology.gpus_per_node", 720_720_000, "topology.gpus_per_node", "at most 1024"),
])
def test_a_scenario_past_a_limit_exits_2_with_one_line_naming_the_field_and_writes_nothing(
        embedded: str, tmp_path: Path, path: str, value: object, field: str,
        words: str) -> None:
    source = scenario_file(tmp_path, path, value)
    output = tmp_path / "fleet-plan.json"
    started = time.monotonic()
    result = run_cli("plan", str(source), "--output", str(output))
    assert time.monotonic() - started < 10
    assert result.exit_code == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert f": {field}: " in line and words in line
    assert not output.exists()
    assert open_store(embedded).head()[0] == 0


def test_a_submitted_plan_whose_figures_overflow_is_refused_naming_the_field(
        embedded: str, tmp_path: Path) -> None:
    plain = json.loads(scenario_file(tmp_path, "workloads.1.mean_service_seconds", 1e307)
                       .read_text("utf-8"))
    command = {"type": "PlanFleet", "command_id": "overflow", "plan_id": "p1", "scenario": plain}
    source = tmp_path / "commands.jsonl"
    source.write_text(json.dumps(command), encoding="utf-8")
    result = run_cli("submit", str(source))
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "line 1: scenario.workloads[1].mean_service_seconds" in result.stderr
    assert open_store(embedded).head()[0] == 0


def _capacity_row(summary: str) -> str:
    (row,) = [line for line in summary.splitlines() if line.startswith("capacity ")]
    return row


def test_the_plan_summary_lists_each_capacity_violation_once(embedded: str,
                                                             tmp_path: Path) -> None:
    """Regression (8): the capacity stage's reasons listed every violation twice."""
    source = scenario_file(tmp_path, "workloads.1.mean_service_seconds", 1e300)
    result = run_cli("plan", str(source), "--output", str(tmp_path / "out.json"))
    assert result.exit_code == 1, result.stderr
    reasons = _capacity_row(result.output).split(None, 2)[2].split(", ")
    assert reasons == ["fleet_sized_by_bottleneck", "replicas_exceed_ceiling",
                       "hourly_cost_exceeds_budget"]


def _listing_violations_twice(stage: str, result: dict[str, Any]) -> tuple[str, list[Any]]:
    """The capacity verdict of DecidePlanStage rules version 1."""
    outcome, reasons = stage_verdict(stage, result)
    return outcome, [*reasons, *result["violations"]] if stage == "capacity" else reasons


def test_a_capacity_decision_recorded_under_rules_1_replays_as_an_upgrade_not_a_fault(
        embedded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = scenario_file(tmp_path, "capacity_requirements.max_hourly_cost", 1.0)
    with monkeypatch.context() as old_rules:
        old_rules.setattr(plan_handlers, "stage_verdict", _listing_violations_twice)
        old_rules.setitem(handlers.RULES_VERSIONS, "DecidePlanStage", 1)
        assert run_cli("plan", str(source), "--output", str(tmp_path / "old.json")).exit_code == 1
    verified = run_cli("replay", "--verify", "--json")
    report = json.loads(verified.output)
    assert verified.exit_code == 0 and report["unexplained_drifts"] == 0
    (drift,) = report["drifts"]
    assert drift["command_id"].endswith(":capacity")
    assert (drift["rules_version"], drift["current_rules_version"], drift["older_rules"]) == (
        1, plan_handlers.RULES_VERSIONS["DecidePlanStage"], True)
    assert drift["recorded"]["reasons"] == ["fleet_sized_by_bottleneck",
                                            "hourly_cost_exceeds_budget",
                                            "hourly_cost_exceeds_budget"]
    assert drift["rederived"]["reasons"] == ["fleet_sized_by_bottleneck",
                                             "hourly_cost_exceeds_budget"]


@pytest.mark.parametrize(("fixture", "edit", "code"), [
    ("cramped-topology", lambda gpus: gpus[1].update(identifier=gpus[0]["identifier"]),
     "duplicate_gpu_id"),
    ("cramped-topology", lambda gpus: gpus[0].update(free_memory_gib=-5), "free_memory_invalid"),
    ("default", lambda gpus: gpus[1].update(identifier=gpus[0]["identifier"]),
     "duplicate_gpu_id"),
])
def test_a_bad_inventory_is_refused_whatever_layout_the_plan_computes(
        embedded: str, tmp_path: Path, fixture: str, edit: Any, code: str) -> None:
    # Before, the inventory was checked only by the placement stage, which runs only when the
    # layout matches the memory plan: the cramped topology's plan was recorded, exit 1.
    plain = json.loads((SCENARIOS / f"{fixture}.json").read_text("utf-8"))
    edit(plain["inventory"])
    source = tmp_path / "scenario.json"
    source.write_text(json.dumps(plain), encoding="utf-8")
    output = tmp_path / "fleet-plan.json"
    result = run_cli("plan", str(source), "--output", str(output))
    assert result.exit_code == 2, result.stderr
    assert "inventory" in result.stderr and code in result.stderr, result.stderr
    assert not output.exists()
    assert open_store(embedded).head()[0] == 0


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
def test_a_plan_it_cannot_write_exits_3_and_the_next_run_writes_it(
        embedded: str, tmp_path: Path) -> None:
    """Decided and recorded, then its file could not be written (a full disk): that exited 2,
    as if the input were bad. It is the machine's fault; running the plan again writes it."""
    source = SCENARIOS / "default.json"
    full = run_cli("plan", str(source), "--output", "/dev/full")
    assert full.exit_code == 3, full.stderr
    (line,) = [line for line in full.stderr.splitlines() if line.strip()]
    assert line.startswith("error: cannot write /dev/full: No space left on device; the plan "
                           "is recorded")
    output = tmp_path / "fleet-plan.json"
    again = run_cli("plan", str(source), "--output", str(output))
    assert again.exit_code in (0, 1), again.stderr
    assert json.loads(output.read_text("utf-8"))["release_ready"] in (True, False)
