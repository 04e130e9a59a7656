"""`fleetctl plan` through the queue: every stage a recorded decision, the plan assembled from
the log equals the pure pipeline's byte for byte, reruns are idempotent, bad input writes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, get_args

import pytest
from redis import Redis

from controlplane.cli.plan import plan_command_id
from controlplane.commands.plan import DecidePlanStage, PlanFleet, StageName, stage_command_id
from controlplane.decisions import ACCEPTED, REJECTED, DecisionContext
from controlplane.handlers import plan as plan_handlers
from controlplane.handlers.plan import handle_decide_plan_stage
from controlplane.policies.fleet_plan import plan_to_plain, run_plan, scenario_from_plain
from controlplane.policies.fleet_plan_scenario import scenario_digest
from controlplane.policies.fleet_plan_stages import STAGE_UPSTREAM, STAGES, run_stage
from controlplane.policies.reasons import PolicyInputError
from controlplane.policy_book import PolicyBook
from controlplane.replay import state_at
from controlplane.replay.verify import verify_decisions
from controlplane.runtime import open_store
from controlplane.service import accept, pending_command_ids
from controlplane.state.plan import EVENT_STAGES, FLEET_PLAN, FLEET_PLAN_STARTED
from events.store import EventStore
from tests.cli_helpers import run_cli

SCENARIOS = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"
NAMES = sorted(path.stem for path in SCENARIOS.glob("*.json"))
READY = {"default", "all-replicas"}
COUNTERFACTUALS = {"drop-generation": ["workload:generation"],
                   "inventory-30gib": ["gpu-placement"],
                   "fits-weights-not-kv": ["gpu-placement"],
                   "cramped-topology": ["gpu-placement", "parallel-layout"],
                   "canary-tpot-regression": ["canary-gate"],
                   "bypass-oversize-shedding": ["oversize-shedding"]}


def scenario_plain(name: str) -> dict[str, Any]:
    plain: dict[str, Any] = json.loads((SCENARIOS / f"{name}.json").read_text("utf-8"))
    return plain


def expected_text(plain: dict[str, Any]) -> str:
    """What the pure pipeline writes for this scenario (spec §2.3 `main`)."""
    return json.dumps(plan_to_plain(run_plan(scenario_from_plain(plain))), indent=2) + "\n"


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str
    text: str

    @property
    def plan(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.text)
        return parsed


def plan_cli(source: Path, output: Path, *extra: str) -> Run:
    result = run_cli("plan", str(source), "--output", str(output), "--json", *extra)
    text = output.read_text("utf-8") if output.exists() else ""
    return Run(result.exit_code, result.output, result.stderr, text)


@dataclass
class Planned:
    url: str
    root: Path
    runs: dict[str, Run]


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Planned]:
    """Every scenario file planned once through the embedded queue into one SQLite log."""
    root = tmp_path_factory.mktemp("plans")
    url = f"sqlite:///{root}/fleet.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLEET_DATABASE_URL", url)
        patch.delenv("FLEET_REDIS_URL", raising=False)
        runs = {name: plan_cli(SCENARIOS / f"{name}.json", root / f"{name}.out.json")
                for name in NAMES}
        yield Planned(url, root, runs)


@pytest.fixture
def embedded(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    return sqlite_url


def plan_events(url: str, name: str) -> list[Any]:
    digest = scenario_digest(scenario_from_plain(scenario_plain(name)))
    return open_store(url).read_stream(f"plan/{digest}")


# --- the plan through the queue equals the pure pipeline ------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_every_scenario_plans_through_the_queue_byte_identical_to_the_pure_pipeline(
        planned: Planned, name: str) -> None:
    run = planned.runs[name]
    assert run.exit_code == (0 if name in READY else 1), run.stderr
    assert run.text == expected_text(scenario_plain(name))
    assert run.stdout == run.text


def test_the_default_plan_reproduces_the_reference_figures(planned: Planned) -> None:
    plan = planned.runs["default"].plan
    assert plan["release_ready"] is True and plan["violations"] == []
    assert plan["observed_evidence"] == plan["required_evidence"] and len(plan["required_evidence"]) == 10
    decisions = plan["decisions"]
    memory = decisions["memory"]
    assert (memory["fits"], memory["max_concurrency"]) == (True, 8)
    assert (memory["weight_gib_per_gpu"], memory["kv_gib_per_gpu"], memory["required_gib_per_gpu"],
            memory["usable_gib_per_gpu"]) == pytest.approx((27.939677238464355, 2.8125,
                                                            34.752177238464355, 36.0))
    capacity = decisions["capacity"]
    assert (capacity["required_replicas"], capacity["bottleneck"],
            capacity["binding_dimensions"]) == (4, "decode_tokens", ["decode_tokens"])
    assert (capacity["prompt_tokens_per_second"], capacity["output_tokens_per_second"],
            capacity["concurrent_requests"], capacity["hourly_cost"],
            capacity["cost_per_million_output_tokens"]) == pytest.approx(
        (1100.0, 825.0, 9.5, 17.0, 5.723905723905724))
    parallel = decisions["parallelism"]
    assert [parallel[k] for k in ("feasible", "tensor_parallel", "pipeline_parallel",
                                  "data_parallel", "expert_parallel")] == [True, 2, 1, 4, 1]
    assert parallel["memory_gib_per_gpu"] == pytest.approx(34.752177238464355)
    (replica,) = decisions["placement"]["replicas"]
    assert replica["decision"]["gpu_ids"] == ["a0", "a1"]
    assert replica["decision"]["remaining_gib"] == pytest.approx(10.4956, abs=1e-4)
    assert (decisions["benign_admission"]["action"], decisions["benign_admission"]["reserved_tokens"],
            decisions["oversize_admission"]["action"]) == ("admit", 500, "shed")
    assert decisions["oversize_admission"]["reasons"][0]["code"] == "token_bound_exceeded"
    scaling = decisions["autoscaling"]
    assert (scaling["target_replicas"], scaling["calculated_demand_replicas"]) == (4, 4)
    assert scaling["ready_capacity_tokens_per_second"] == pytest.approx(1050.0)
    assert decisions["rollout"]["action"] == "promote"
    assert list(plan["deciding_reasons"]) == [
        "memory-fit", "capacity-plan", "parallel-layout", "gpu-placement", "benign-admission",
        "oversize-shedding", "queue-scaling", "canary-gate"]


@pytest.mark.parametrize("name", sorted(COUNTERFACTUALS))
def test_each_counterfactual_fails_on_exactly_its_missing_evidence(planned: Planned,
                                                                  name: str) -> None:
    plan = planned.runs[name].plan
    missing = COUNTERFACTUALS[name]
    assert plan["release_ready"] is False
    assert plan["missing_evidence"] == missing
    assert [v["code"] for v in plan["violations"]] == ["missing_required_evidence"]
    assert set(plan["observed_evidence"]) == set(plan["required_evidence"]) - set(missing)


def test_counterfactual_figures_match_the_reference(planned: Planned) -> None:
    dropped = planned.runs["drop-generation"].plan["decisions"]
    capacity = dropped["capacity"]
    assert (capacity["prompt_tokens_per_second"], capacity["output_tokens_per_second"],
            capacity["concurrent_requests"], capacity["hourly_cost"],
            capacity["cost_per_million_output_tokens"]) == pytest.approx(
        (900.0, 225.0, 4.5, 8.5, 10.4938), abs=1e-4)
    assert (capacity["required_replicas"], capacity["bottleneck"],
            capacity["binding_dimensions"]) == (2, "minimum_replica_floor",
                                                ["minimum_replica_floor", "prefill_tokens"])
    assert dropped["parallelism"]["data_parallel"] == 2
    assert (dropped["autoscaling"]["target_replicas"],
            dropped["autoscaling"]["ready_capacity_tokens_per_second"]) == (2, 525.0)
    for name in ("inventory-30gib", "fits-weights-not-kv"):
        placement = planned.runs[name].plan["decisions"]["placement"]
        assert [r["code"] for r in placement["reasons"]] == ["replica_placement_refused",
                                                             "no_feasible_group"]
    cramped = planned.runs["cramped-topology"].plan["decisions"]
    assert [cramped["parallelism"][k] for k in ("tensor_parallel", "pipeline_parallel",
                                                "data_parallel", "expert_parallel")] == [1, 3, 2, 1]
    assert cramped["parallelism"]["memory_gib_per_gpu"] == pytest.approx(25.43895149230957)
    assert [r["code"] for r in cramped["placement"]["reasons"]] == [
        "placement_not_requested_layout_mismatch"]
    rollout = planned.runs["canary-tpot-regression"].plan["decisions"]["rollout"]
    assert (rollout["action"], [r["code"] for r in rollout["reasons"]]) == (
        "rollback", ["p95_tpot_exceeds_objective"])
    oversize = planned.runs["bypass-oversize-shedding"].plan["decisions"]["oversize_admission"]
    assert (oversize["action"], oversize["reserved_tokens"]) == ("admit", 9000)


def test_all_replicas_places_every_required_replica(planned: Planned) -> None:
    placement = planned.runs["all-replicas"].plan["decisions"]["placement"]
    assert (placement["requested_replicas"], placement["placed_replicas"]) == (4, 4)
    assert [r["decision"]["gpu_ids"] for r in placement["replicas"]] == [
        ["a0", "a1"], ["a2", "a3"], ["b0", "b1"], ["b2", "b3"]]


# --- every stage is a decision, in order, caused by the one before ---------------------------


def test_each_stage_is_a_decision_issued_by_the_stage_before_it(planned: Planned) -> None:
    store = open_store(planned.url)
    events = plan_events(planned.url, "default")
    started, *stages = events
    assert started.event_type == FLEET_PLAN_STARTED
    assert [EVENT_STAGES[e.event_type] for e in stages] == list(STAGES)
    by_stage = {EVENT_STAGES[e.event_type]: e for e in stages}
    previous = started
    for stage, decided in by_stage.items():
        accepted = next(e for e in store.events_for_command(decided.command_id or "")
                        if e.event_type == ACCEPTED)
        assert accepted.causation_id == previous.event_id, stage
        assert decided.data["causes"] == [started.event_id, *(
            by_stage[u].event_id for u in STAGE_UPSTREAM[stage])]
        previous = decided
    assert by_stage["grade"].data["outcome"] == "release_ready"


def test_stage_decisions_record_the_scenario_fields_and_policy_they_used(planned: Planned) -> None:
    by_stage = {EVENT_STAGES[e.event_type]: e for e in plan_events(planned.url, "inventory-30gib")
                if e.event_type in EVENT_STAGES}
    placement = by_stage["placement"].data
    assert placement["outcome"] == "not_placed"
    assert {gpu["free_memory_gib"] for gpu in placement["inputs"]["scenario"]["inventory"]} == {30.0}
    assert placement["policy"]["parameters"]["placement_mode"] == "reference-single"
    assert by_stage["memory"].data["policy"] is None


def test_replay_verify_reports_no_drift_after_plans(planned: Planned) -> None:
    result = run_cli("replay", "--verify", "--json")
    verified = json.loads(result.output)
    assert (result.exit_code, verified["drifts"]) == (0, [])
    assert verified["decisions_checked"] == 9 * len(NAMES)
    rebuilt = run_cli("replay", "--json")
    assert (rebuilt.exit_code, json.loads(rebuilt.output)["projection_differences"]) == (0, [])


def test_stage_names_of_the_command_are_the_pipeline_stages() -> None:
    assert get_args(StageName) == STAGES
    assert len(stage_command_id("x" * 100, "placement")) <= 100


def test_stage_commands_outside_the_chain_or_out_of_order_are_refused(planned: Planned) -> None:
    store = open_store(planned.url)
    state = state_at(store)
    digest = scenario_digest(scenario_from_plain(scenario_plain("default")))
    chain_id = partial(stage_command_id, plan_command_id(digest))
    row = state.get(FLEET_PLAN, digest)
    assert row is not None and row["status"] == "graded"
    state.put(FLEET_PLAN, "p-partial", {**row, "plan_id": "p-partial", "stages": {
        name: row["stages"][name] for name in ("capacity", "memory")}})
    context = DecisionContext(state, store.head()[0], lambda _: 0, PolicyBook(), None)
    cases = [(DecidePlanStage(command_id="stray", plan_id=digest, stage="grade"),
              "stage_not_issued_by_plan"),
             (DecidePlanStage(command_id=chain_id("grade"), plan_id=digest, stage="grade"),
              "stage_already_decided"),
             (DecidePlanStage(command_id=chain_id("placement"), plan_id="p-partial",
                              stage="placement"), "upstream_stage_missing"),
             (DecidePlanStage(command_id="lost", plan_id="no-such-plan", stage="memory"),
              "unknown_plan")]
    for command, code in cases:
        (append,) = handle_decide_plan_stage(command, context)
        (event,) = append.events
        assert (event.event_type, event.data["reasons"][0]["code"]) == (REJECTED, code)


def test_a_refused_stage_stalls_the_plan_and_exits_3_naming_its_code(
        embedded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def undecidable(stage: str, *args: Any) -> dict[str, Any]:
        if stage == "layout":
            raise PolicyInputError("topology_withdrawn", "topology", "no topology today")
        return run_stage(stage, *args)

    monkeypatch.setattr(plan_handlers, "run_stage", undecidable)
    output = tmp_path / "out.json"
    result = run_cli("plan", str(SCENARIOS / "default.json"), "--output", str(output))
    assert result.exit_code == 3 and "topology_withdrawn" in result.stderr
    assert not output.exists()
    digest = scenario_digest(scenario_from_plain(scenario_plain("default")))
    row = state_at(open_store(embedded)).get(FLEET_PLAN, digest)
    assert row is not None and row["status"] == "refused"
    assert sorted(row["stages"]) == ["capacity", "memory"]


# --- idempotent reruns and the digest --------------------------------------------------------


def test_a_rerun_writes_byte_identical_files_and_appends_nothing(planned: Planned) -> None:
    head = open_store(planned.url).head()
    again = plan_cli(SCENARIOS / "default.json", planned.root / "again.json")
    assert again.exit_code == 0 and again.text == planned.runs["default"].text
    assert open_store(planned.url).head() == head


def test_a_fresh_database_writes_the_same_bytes(embedded: str, tmp_path: Path,
                                                planned: Planned) -> None:
    for name in ("default", "cramped-topology"):
        run = plan_cli(SCENARIOS / f"{name}.json", tmp_path / f"{name}.json")
        assert run.text == planned.runs[name].text


def test_changing_one_input_changes_the_inputs_digest(embedded: str, tmp_path: Path,
                                                      planned: Planned) -> None:
    plain = scenario_plain("default")
    plain["candidate_release"]["p95_tpot_seconds"] = 0.11
    source = tmp_path / "tweaked.json"
    source.write_text(json.dumps(plain), encoding="utf-8")
    run = plan_cli(source, tmp_path / "tweaked.out.json")
    assert run.exit_code == 0
    digest = run.plan["inputs_digest"]
    assert digest != planned.runs["default"].plan["inputs_digest"]
    assert digest == scenario_digest(scenario_from_plain(plain))
    assert run.text == expected_text(plain)


def test_a_plan_left_undecided_by_an_earlier_process_is_finished_by_the_next_run(
        embedded: str, tmp_path: Path, planned: Planned) -> None:
    scenario = scenario_from_plain(scenario_plain("default"))
    digest = scenario_digest(scenario)
    store = open_store(embedded)
    accept(store, [PlanFleet(command_id=plan_command_id(digest), plan_id=digest,
                             scenario=scenario_plain("default"))])  # accepted, never enqueued
    run = plan_cli(SCENARIOS / "default.json", tmp_path / "finished.json")
    assert run.exit_code == 0 and run.text == planned.runs["default"].text


def test_on_the_embedded_queue_the_timeout_stops_the_stages_and_a_rerun_finishes_them(
        embedded: str, tmp_path: Path, planned: Planned) -> None:
    # The stages run in this process: before, --timeout was never looked at there.
    stopped = plan_cli(SCENARIOS / "default.json", tmp_path / "stopped.json", "--timeout", "1e-6")
    assert stopped.exit_code == 3 and not stopped.text
    assert "not graded after 1e-06s" in stopped.stderr
    assert "run the same plan again" in stopped.stderr
    assert pending_command_ids(open_store(embedded))  # its next stage waits in the inbox
    run = plan_cli(SCENARIOS / "default.json", tmp_path / "finished.json")
    assert run.exit_code == 0 and run.text == planned.runs["default"].text
    assert not pending_command_ids(open_store(embedded))


# --- bad input is refused and writes nothing -------------------------------------------------


@pytest.mark.parametrize(("path", "value", "field"), [
    (("topology", "gpu_memory_gib"), float("nan"), "topology.gpu_memory_gib"),
    (("capacity_requirements", "min_replicas"), 2.5, "capacity_requirements.min_replicas"),
    (("benchmark", "surprise"), 1, "benchmark.surprise"),
    (("required_evidence",), ["memory-fit"], "required_evidence"),
])
def test_a_bad_scenario_exits_2_naming_the_field_and_writes_nothing(
        embedded: str, tmp_path: Path, path: tuple[str, ...], value: object, field: str) -> None:
    plain = scenario_plain("default")
    node: Any = plain
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    source = tmp_path / "bad.json"
    source.write_text(json.dumps(plain), encoding="utf-8")  # NaN is written as a bare NaN
    output = tmp_path / "fleet-plan.json"
    result = run_cli("plan", str(source), "--output", str(output))
    assert result.exit_code == 2
    assert f": {field}: " in result.stderr and "Traceback" not in result.stderr
    assert not output.exists()
    assert open_store(embedded).head()[0] == 0


def test_a_file_that_is_not_json_exits_2(embedded: str, tmp_path: Path) -> None:
    source = tmp_path / "broken.json"
    source.write_text("{", encoding="utf-8")
    result = run_cli("plan", str(source), "--output", str(tmp_path / "out.json"))
    assert result.exit_code == 2 and "not JSON" in result.stderr
    assert not (tmp_path / "out.json").exists()


def test_a_submitted_plan_with_a_bad_scenario_is_refused_naming_the_field(
        embedded: str, tmp_path: Path) -> None:
    plain = scenario_plain("default")
    plain["model_memory"]["kv_heads"] = 0
    command = {"type": "PlanFleet", "command_id": "bad-plan", "plan_id": "p1", "scenario": plain}
    source = tmp_path / "commands.jsonl"
    source.write_text(json.dumps(command), encoding="utf-8")
    result = run_cli("submit", str(source))
    assert result.exit_code == 2
    assert "line 1: scenario.model_memory.kv_heads" in result.stderr
    assert open_store(embedded).head()[0] == 0


def test_a_stage_command_cannot_be_submitted_from_outside_its_plan(
        embedded: str, tmp_path: Path) -> None:
    command = {"type": "DecidePlanStage", "command_id": "sneaky", "plan_id": "p1",
               "stage": "grade"}
    source = tmp_path / "commands.jsonl"
    source.write_text(json.dumps(command), encoding="utf-8")
    assert run_cli("submit", str(source)).exit_code == 2
    assert open_store(embedded).head()[0] == 0


# --- real PostgreSQL / SQLite, real Redis, forking workers -----------------------------------


@pytest.fixture
def forking_workers(real_redis: Redis) -> Iterator[subprocess.Popen[bytes]]:
    """`fleetctl worker --processes 2` (forking RQ workers) in its own process group."""
    workers = subprocess.Popen([sys.executable, "-m", "controlplane.cli.main", "worker",
                                "--processes", "2"], env=dict(os.environ), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield workers
    os.killpg(workers.pid, signal.SIGTERM)
    try:
        workers.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(workers.pid, signal.SIGKILL)
        workers.wait(timeout=10)


@pytest.mark.slow
def test_forking_workers_on_real_redis_decide_the_byte_identical_plan(
        store: EventStore, forking_workers: subprocess.Popen[bytes], tmp_path: Path) -> None:
    for name in ("default", "cramped-topology"):
        run = plan_cli(SCENARIOS / f"{name}.json", tmp_path / f"{name}.json", "--timeout", "120")
        assert run.exit_code == (0 if name in READY else 1), run.stderr
        assert run.text == expected_text(scenario_plain(name))
        again = plan_cli(SCENARIOS / f"{name}.json", tmp_path / f"{name}.again.json")
        assert again.text == run.text
    report = verify_decisions(store)
    assert report.identical and report.decisions_checked == 18


def test_without_workers_the_plan_times_out_with_exit_3(
        sqlite_url: str, real_redis: Redis, tmp_path: Path) -> None:
    output = tmp_path / "out.json"
    result = run_cli("plan", str(SCENARIOS / "default.json"), "--output", str(output),
                     "--timeout", "0.3")
    assert result.exit_code == 3 and "not graded" in result.stderr
    assert not output.exists()
