"""Fleet-plan scenarios at the edges of what a plan can hold: the size a PlanFleet command
carries, figures that overflow a float, a node's GPU count, and violations recorded once."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from controlplane.commands.plan import PlanFleet
from controlplane.policies.fleet_plan import run_plan, scenario_from_plain
from controlplane.policies.fleet_plan_scenario import MAX_SCENARIO_BYTES, canonical_json
from controlplane.policies.fleet_plan_stages import run_stages, stage_verdict
from controlplane.policies.parallelism import MAX_GPUS_PER_NODE
from controlplane.policies.reasons import PolicyInputError, to_plain

SCENARIOS = Path(__file__).resolve().parents[3] / "fixtures" / "scenarios"
MAX_FLOAT = 1.7976931348623157e308


def default_plain() -> dict[str, Any]:
    plain: dict[str, Any] = json.loads((SCENARIOS / "default.json").read_text("utf-8"))
    return plain


def with_value(path: str, value: object) -> dict[str, Any]:
    plain = default_plain()
    *parents, last = path.split(".")
    node: Any = plain
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value
    return plain


def refusal(plain: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(PolicyInputError) as caught:
        scenario_from_plain(plain)
    return caught.value.code, caught.value.field


def canonical_size(plain: dict[str, Any]) -> int:
    return len(canonical_json(to_plain(scenario_from_plain(plain))).encode("utf-8"))


# --- size: what the parser accepts, a PlanFleet command carries --------------------------------


def test_a_scenario_over_the_size_limit_is_refused_naming_its_largest_field() -> None:
    """Regression: a 1 MB description passed the parser, then PlanFleet refused it with a
    pydantic traceback (exit 1)."""
    plain = with_value("description", "x" * 1_000_000)
    with pytest.raises(PolicyInputError) as caught:
        scenario_from_plain(plain)
    assert (caught.value.code, caught.value.field) == ("scenario_too_large", "description")
    assert f"limit of {MAX_SCENARIO_BYTES} bytes" in caught.value.message


def test_every_scenario_the_parser_accepts_fits_in_a_plan_command() -> None:
    base = with_value("description", "")
    room = MAX_SCENARIO_BYTES - canonical_size(base)
    at_limit = with_value("description", "x" * room)
    scenario = scenario_from_plain(at_limit)
    assert canonical_size(at_limit) == MAX_SCENARIO_BYTES
    PlanFleet(command_id="c", plan_id="p", scenario=to_plain(scenario))
    assert refusal(with_value("description", "x" * (room + 1))) == ("scenario_too_large",
                                                                     "description")


# --- derived figures that overflow a float ---------------------------------------------------


@pytest.mark.parametrize(("path", "value", "code", "field"), [
    # Regression: ready capacity = required replicas x 350 x 0.75 overflowed in the scaling
    # stage and the plan died with `non-finite number inf in a decision` (exit 1).
    ("workloads.1.mean_service_seconds", 1e307, "ready_capacity_not_finite",
     "workloads[1].mean_service_seconds"),
    ("workloads.0.mean_service_seconds", 1e307, "ready_capacity_not_finite",
     "workloads[0].mean_service_seconds"),
    ("workloads.1.output_tokens", MAX_FLOAT, "ready_capacity_not_finite",
     "workloads[1].output_tokens"),
    ("benchmark.max_concurrent_requests", 1e-305, "ready_capacity_not_finite",
     "benchmark.max_concurrent_requests"),
    ("autoscaling.policy.service_tokens_per_second_per_replica", MAX_FLOAT,
     "ready_capacity_not_finite", "autoscaling.policy.service_tokens_per_second_per_replica"),
    pytest.param("autoscaling.queued_tokens", 10**400, "queued_tokens_out_of_range",
                 "autoscaling.queued_tokens", id="queued_tokens-10**400"),
])
def test_a_scenario_whose_derived_figures_overflow_is_refused_naming_the_field(
        path: str, value: object, code: str, field: str) -> None:
    assert refusal(with_value(path, value)) == (code, field)


def test_an_evidence_age_that_overflows_is_refused_naming_the_observation_time() -> None:
    plain = default_plain()
    plain["evaluated_at_seconds"] = MAX_FLOAT
    plain["autoscaling"]["observation_timestamp_seconds"] = MAX_FLOAT
    plain["autoscaling"]["last_scale_at_seconds"] = MAX_FLOAT
    plain["evidence_times"]["benchmark"]["observed_at_seconds"] = -MAX_FLOAT
    assert refusal(plain) == ("evidence_age_not_finite",
                              "evidence_times.benchmark.observed_at_seconds")


def test_a_huge_but_finite_fleet_is_still_a_decision_not_a_refusal() -> None:
    plan = run_plan(scenario_from_plain(with_value("workloads.1.mean_service_seconds", 1e300)))
    assert plan.release_ready is False
    assert [v.code for v in plan.violations][:2] == ["replicas_exceed_ceiling",
                                                     "hourly_cost_exceeds_budget"]


# --- a node's GPU count -----------------------------------------------------------------------


def test_a_node_of_more_gpus_than_the_limit_is_refused_quickly_naming_the_field() -> None:
    """Regression: 720,720,000 GPUs per node took 183 s (three passes of a linear scan)."""
    started = time.monotonic()
    assert refusal(with_value("topology.gpus_per_node", 720_720_000)) == (
        "gpus_per_node_above_limit", "topology.gpus_per_node")
    assert refusal(with_value("topology.gpus_per_node", MAX_GPUS_PER_NODE + 1))[1] == \
        "topology.gpus_per_node"
    assert time.monotonic() - started < 5
    scenario_from_plain(with_value("topology.gpus_per_node", MAX_GPUS_PER_NODE))


# --- each capacity violation recorded once ----------------------------------------------------


@pytest.mark.parametrize(("path", "value"), [("workloads.1.mean_service_seconds", 1e300),
                                             ("capacity_requirements.max_hourly_cost", 1.0)])
def test_the_capacity_decision_records_each_violation_once(path: str, value: object) -> None:
    """Regression: the capacity stage's reasons were its plan's reasons (sizing, then every
    violation) followed by the violations again."""
    capacity = run_stages(scenario_from_plain(with_value(path, value)))["capacity"]
    outcome, reasons = stage_verdict("capacity", capacity)
    codes = [reason["code"] for reason in reasons]
    assert outcome == "violates_requirements"
    assert codes == ["fleet_sized_by_bottleneck",
                     *(violation["code"] for violation in capacity["violations"])]
    assert len(codes) == len(set(codes))
