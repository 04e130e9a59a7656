"""Rollouts through the queue and the log: evidence issues its evaluation, the ladder moves one
rung per measurement, a passing canary promotes and a regression rolls back observably."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controlplane.explain import explain_id
from controlplane.policy_book import PolicyBook, load_overrides
from controlplane.replay import state_at
from controlplane.replay.verify import verify_decisions
from events.model import RecordedEvent
from events.store import EventStore
from tests.cli_helpers import run_cli
from tests.factories import place_replica, register_model, register_node
from tests.fleet_helpers import assert_replay_exact, decision, run

# Spec section 5 exercise 11 / 4 test_rollouts: baseline, candidate and requirements.
BASELINE = {"revision": "stable", "mode": "canary", "warmed": True, "sample_count": 10_000,
            "quality_score": 0.90, "p95_ttft_seconds": 0.8, "p95_tpot_seconds": 0.1,
            "output_tokens_per_second": 100.0, "error_rate": 0.001}
CANDIDATE = {**BASELINE, "revision": "candidate", "sample_count": 1_000, "quality_score": 0.89,
             "output_tokens_per_second": 105.0, "error_rate": 0.002}
QUANTIZED = {"name": "int4", "weight_bits": 4, "hardware_supported": True, "quality_score": 0.89,
             "weight_memory_gib": 5.0, "p95_ttft_seconds": 0.7, "output_tokens_per_second": 120.0}
FP16 = {**QUANTIZED, "name": "fp16", "weight_bits": 16, "quality_score": 0.90,
        "weight_memory_gib": 16.0, "output_tokens_per_second": 100.0}


pytestmark = pytest.mark.usefixtures("embedded_queue")






def start(rollout_id: str = "ro1", **extra: Any) -> list[dict[str, Any]]:
    return [register_node("n1", gpus=1), register_model(), place_replica("r1"),
            {"type": "StartRollout", "command_id": f"start-{rollout_id}", "rollout_id": rollout_id,
             "pool_id": "chat", "baseline_revision": "stable",
             "candidate_revision": "candidate", **extra}]


def measure(command_id: str, mode: str = "canary", rollout_id: str = "ro1",
            **candidate: Any) -> dict[str, Any]:
    return {"type": "RecordCanaryMeasurement", "command_id": command_id, "rollout_id": rollout_id,
            "baseline": BASELINE, "candidate": {**CANDIDATE, "mode": mode, **candidate}}


def evaluation(store: EventStore, measurement_id: str) -> RecordedEvent:
    return decision(store, f"{measurement_id}:evaluate")


def rollout(store: EventStore, rollout_id: str = "ro1") -> dict[str, Any]:
    row = state_at(store).get("rollout", rollout_id)
    assert row is not None
    return row


def to_canary(store: EventStore) -> None:
    """Start ro1 and walk it to the first canary rung: warm evidence ends warmup, shadow
    evidence measured in shadow clears the shadow stage."""
    run(store, *start(), measure("m1", "shadow"))
    run(store, measure("m2", "shadow"))
    assert (rollout(store)["stage"], rollout(store)["candidate_traffic_percent"]) == ("canary", 1.0)






def test_a_canary_passing_every_gate_climbs_one_rung_per_measurement_and_promotes(
        store: EventStore) -> None:
    run(store, *start())
    assert rollout(store)["stage"] == "warmup" and rollout(store)["requirements_version"] == 0
    steps = [("m1", "shadow"), ("m2", "shadow"), ("m3", "canary"), ("m4", "canary")]
    for measurement_id, mode in steps:
        run(store, measure(measurement_id, mode))
    decided = [evaluation(store, m) for m, _ in steps]
    assert [(e.event_type, e.data["result"]["to_stage"], e.data["result"]["candidate_traffic_percent"])
            for e in decided] == [("RolloutAdvanced", "shadow", 0.0),
                                  ("RolloutAdvanced", "canary", 1.0),
                                  ("RolloutAdvanced", "canary", 10.0),
                                  ("RolloutPromoted", "promoted", 100.0)]
    assert decided[0].data["reasons"][0]["code"] == "warmup_complete"
    assert decided[-1].data["reasons"][0]["code"] == "all_gates_passed"
    recorded = decision(store, "m4")
    accepted = store.events_for_command("m4:evaluate")[0]
    assert accepted.causation_id == recorded.event_id
    assert decided[-1].data["causes"] == [recorded.event_id, decided[-2].event_id]
    row = rollout(store)
    assert (row["stage"], row["candidate_traffic_percent"], len(row["transitions"])) == (
        "promoted", 100.0, 4)
    assert_replay_exact(store)


def test_one_tail_latency_regression_rolls_back_removes_traffic_and_names_the_gate(
        store: EventStore) -> None:
    to_canary(store)
    run(store, measure("m3", "canary", p95_tpot_seconds=0.2))
    rolled_back = evaluation(store, "m3")
    assert rolled_back.event_type == "RolloutRolledBack"
    assert [r["code"] for r in rolled_back.data["reasons"]] == ["p95_tpot_exceeds_objective"]
    assert rolled_back.data["reasons"][0]["facts"] == {"p95_tpot_seconds": 0.2,
                                                      "max_p95_tpot_seconds": 0.15}
    result = rolled_back.data["result"]
    assert (result["from_stage"], result["to_stage"], result["candidate_traffic_percent"]) == (
        "canary", "rolled_back", 0.0)
    row = rollout(store)
    assert row["deciding_codes"] == ["p95_tpot_exceeds_objective"]
    assert row["transitions"][-1]["action"] == "rollback"
    run(store, measure("m4", "canary"))
    refused = decision(store, "m4")
    assert (refused.data["outcome"], refused.data["reasons"][0]["code"]) == (
        "rejected", "rollout_finished")
    chain = [step["command_id"] for step in explain_id(store, "m3:evaluate")["chain"]]
    assert "m3" in chain and "m2:evaluate" in chain
    assert_replay_exact(store)


def test_a_finished_rollout_refuses_evaluation_and_explain_still_names_its_rollback(
        store: EventStore) -> None:
    # Before, each evaluation of a finished rollout appended a `RolloutHeld` (rollout_finished),
    # and `explain ro1` answered with that hold instead of the rollback.
    to_canary(store)
    run(store, measure("bad", "canary", p95_tpot_seconds=0.2), measure("good", "canary"))
    assert evaluation(store, "bad").event_type == "RolloutRolledBack"
    late = evaluation(store, "good")
    assert (late.data["outcome"], late.data["reasons"][0]["code"]) == ("rejected", "rollout_finished")
    run(store, {"type": "EvaluateCanary", "command_id": "again", "rollout_id": "ro1",
                "measurement_id": "good"})
    assert decision(store, "again").data["reasons"][0]["code"] == "rollout_finished"
    assert not [e for e in store.read_stream("rollout/ro1") if e.event_type == "RolloutHeld"]
    assert explain_id(store, "ro1")["chain"][0]["event_type"] == "RolloutRolledBack"
    assert_replay_exact(store)


def test_a_what_if_of_the_rollout_policy_changes_the_verdicts_of_rollouts_that_copied_it(
        store: EventStore, tmp_path: Path) -> None:
    # Evaluations read the requirements their rollout copied from the policy at its start: a
    # what-if of the policy had changed only the starts, never a verdict.
    to_canary(store)
    run(store, measure("m3", "canary", p95_tpot_seconds=0.2))
    assert evaluation(store, "m3").event_type == "RolloutRolledBack"
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"rollout": {"max_p95_tpot_seconds": 0.5}}))
    report = verify_decisions(store, PolicyBook(load_overrides(policy_file)))
    verdicts = {d.command_id: (d.recorded["outcome"], d.rederived["outcome"])
                for d in report.drifts}
    assert verdicts["m3:evaluate"] == ("rollback", "advance")
    assert_replay_exact(store)


def test_immature_evidence_holds_shadow_never_promotes_and_evidence_moves_the_ladder_once(
        store: EventStore) -> None:
    run(store, *start(), measure("cold", "shadow", warmed=False))
    assert evaluation(store, "cold").data["reasons"][0]["code"] == "candidate_not_warmed"
    run(store, measure("warm", "shadow"))
    run(store, measure("few", "shadow", sample_count=10))
    held = evaluation(store, "few")
    assert (held.event_type, held.data["reasons"][0]["code"]) == ("RolloutHeld", "insufficient_samples")
    assert held.data["causes"] == [decision(store, "few").event_id, evaluation(store, "warm").event_id]
    run(store, measure("passing-shadow", "shadow"))
    assert rollout(store)["stage"] == "canary"  # shadow passes into the canary, never to promotion
    run(store, {"type": "EvaluateCanary", "command_id": "again", "rollout_id": "ro1",
                "measurement_id": "passing-shadow"},
        measure("late-shadow", "shadow"))
    assert decision(store, "again").data["reasons"][0]["code"] == "evidence_already_used"
    assert evaluation(store, "late-shadow").data["reasons"][0]["code"] == "evidence_mode_mismatch"
    assert rollout(store)["candidate_traffic_percent"] == 1.0
    assert_replay_exact(store)


def test_required_quantization_evidence_is_judged_by_its_gate_and_a_failure_rolls_back(
        store: EventStore) -> None:
    thresholds = {"min_quality_score": 0.85, "max_quality_drop": 0.03,
                  "max_weight_memory_gib": 8.0, "max_p95_ttft_seconds": 1.0,
                  "min_relative_throughput": 1.0}
    requirements = {"required_gates": ["quantization"], "canary_traffic_percents": [5.0]}
    run(store, *start(requirements=requirements, quantization_requirements=thresholds),
        measure("m1", "shadow"))
    run(store, measure("m2", "shadow"))
    assert evaluation(store, "m2").data["reasons"][0]["code"] == "required_gate_evidence_missing"
    assert rollout(store)["requirements_version"] == "declared"
    unsupported = {**measure("m3", "shadow"),
                   "quantization": {"baseline": FP16,
                                    "candidate": {**QUANTIZED, "hardware_supported": False}}}
    run(store, unsupported)
    assert decision(store, "m3").data["result"]["gates"]["quantization"]["passed"] is False
    rolled_back = evaluation(store, "m3")
    assert rolled_back.event_type == "RolloutRolledBack"
    failed = rolled_back.data["reasons"][0]
    assert failed["code"] == "gate_evidence_failed"
    assert failed["facts"] == {"gate": "quantization",
                               "gate_reason_codes": ["hardware_kernel_unsupported"]}
    assert_replay_exact(store)


def test_a_passing_quantization_gate_lets_the_shadow_advance(store: EventStore) -> None:
    thresholds = {"min_quality_score": 0.85, "max_quality_drop": 0.03,
                  "max_weight_memory_gib": 8.0, "max_p95_ttft_seconds": 1.0,
                  "min_relative_throughput": 1.0}
    run(store, *start(requirements={"required_gates": ["quantization"]},
                      quantization_requirements=thresholds), measure("m1", "shadow"))
    run(store, {**measure("m2", "shadow"), "quantization": {"baseline": FP16, "candidate": QUANTIZED}})
    advanced = evaluation(store, "m2")
    assert (advanced.event_type, advanced.data["result"]["to_stage"]) == ("RolloutAdvanced", "canary")
    assert rollout(store)["gates"]["quantization"]["passed"] is True
    assert_replay_exact(store)


def test_each_rung_is_cleared_only_by_evidence_measured_on_it(store: EventStore) -> None:
    """Two measurements taken at 1% (one submission, both recorded before either is judged):
    the first widens the canary to 10%; the second, measured at 1%, may not promote it."""
    to_canary(store)
    run(store, measure("at-1", "canary"), measure("also-at-1", "canary"))
    assert evaluation(store, "at-1").data["result"]["candidate_traffic_percent"] == 10.0
    refused = evaluation(store, "also-at-1")
    assert (refused.data["outcome"], refused.data["reasons"][0]["code"]) == (
        "rejected", "evidence_from_another_step")
    assert refused.data["reasons"][0]["facts"] == {"field": "measurement_id"}
    assert "canary step 0" in refused.data["reasons"][0]["message"]
    assert (rollout(store)["stage"], rollout(store)["candidate_traffic_percent"]) == ("canary", 10.0)
    run(store, measure("at-10", "canary"))
    assert evaluation(store, "at-10").event_type == "RolloutPromoted"
    assert_replay_exact(store)


def test_shadow_evidence_recorded_in_warmup_cannot_clear_the_shadow_stage(
        store: EventStore) -> None:
    """Two shadow measurements recorded while the rollout warms up (one submission): the first
    ends warmup; the second, taken before any shadow traffic, may not clear the shadow stage
    (it had, putting user traffic on a candidate never measured in shadow)."""
    run(store, *start(), measure("m1", "shadow"), measure("m2", "shadow"))
    assert evaluation(store, "m1").data["result"]["to_stage"] == "shadow"
    refused = evaluation(store, "m2")
    assert (refused.data["outcome"], refused.data["reasons"][0]["code"]) == (
        "rejected", "evidence_from_another_step")
    assert "stage warmup" in refused.data["reasons"][0]["message"]
    assert (rollout(store)["stage"], rollout(store)["candidate_traffic_percent"]) == ("shadow", 0.0)
    run(store, measure("m3", "shadow"))
    assert evaluation(store, "m3").data["result"]["to_stage"] == "canary"
    assert_replay_exact(store)


def test_canary_evidence_taken_before_the_canary_cannot_clear_its_first_rung(
        store: EventStore) -> None:
    run(store, *start(), measure("m1", "shadow"))
    run(store, measure("early", "canary"))  # taken in shadow, with no user traffic on it
    assert evaluation(store, "early").data["reasons"][0]["code"] == "evidence_mode_mismatch"
    run(store, measure("m2", "shadow"))
    assert rollout(store)["stage"] == "canary"
    run(store, {"type": "EvaluateCanary", "command_id": "reuse", "rollout_id": "ro1",
                "measurement_id": "early"})
    assert decision(store, "reuse").data["reasons"][0]["code"] == "evidence_from_another_step"
    assert rollout(store)["candidate_traffic_percent"] == 1.0
    assert_replay_exact(store)


def test_the_longest_ids_commands_accept_are_stored_on_every_database(store: EventStore) -> None:
    """A rollout id of 200 characters and a measurement id of 100 make a projection key of 301
    (`rollout/measurement`): PostgreSQL's 300-character column refused the batch's write, on
    every retry, leaving every command batched with it undecided."""
    rollout_id, measurement_id = "r" * 200, "m" * 100
    *fleet, opening = start(rollout_id)
    run(store, *fleet, {**opening, "command_id": "start-long"},
        measure(measurement_id, "shadow", rollout_id=rollout_id))
    assert decision(store, measurement_id).event_type == "CanaryMeasurementRecorded"
    assert rollout(store, rollout_id)["stage"] == "shadow"
    assert_replay_exact(store)


def test_a_speculation_round_whose_target_misses_the_bonus_position_is_refused_at_submit(
        store: EventStore) -> None:
    """Checkable from the command alone: refused naming the round, nothing written (it was
    accepted, then recorded as a rejection)."""
    run(store, *start())
    before = store.head()[0]
    costs = {"baseline_seconds_per_token": 0.02, "draft_seconds_per_token": 0.002,
             "verification_seconds_per_round": 0.025}
    bad = {**measure("m-spec"), "speculation": {
        "rounds": [{"draft_tokens": [1, 2], "target_tokens": [1, 2, 3]},
                   {"draft_tokens": [1, 2, 3], "target_tokens": [1, 2, 3]}], "costs": costs}}
    refused = run_cli("submit", "-", input_text=json.dumps(bad))
    assert refused.exit_code == 2
    assert "speculation.rounds.1" in refused.stderr
    assert "target_tokens must be longer than draft_tokens" in refused.stderr
    assert store.head()[0] == before


SPECULATION = {"rounds": [{"draft_tokens": [1, 2, 3], "target_tokens": [1, 2, 3, 4]}] * 4,
               "costs": {"baseline_seconds_per_token": 0.02, "draft_seconds_per_token": 0.002,
                         "verification_seconds_per_round": 0.025}}


def test_a_what_if_of_the_minimum_speedup_judges_the_measured_speculation_again(
        store: EventStore, tmp_path: Path) -> None:
    """The speculation gate's verdict was fixed when its measurement was recorded, which reads
    no policy: a what-if of `speculation_minimum_speedup` changed no evaluation. The evaluation
    judges the measured speedup (2.58x) by the minimum it uses, so 1,000x rolls it back."""
    run(store, *start())
    run(store, measure("m1", "shadow"))
    run(store, {**measure("m2", "shadow"), "speculation": SPECULATION})
    assert (evaluation(store, "m2").data["outcome"], rollout(store)["stage"]) == ("advance", "canary")
    assert_replay_exact(store)
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"rollout": {"speculation_minimum_speedup": 1000.0}}))
    report = verify_decisions(store, PolicyBook(load_overrides(policy_file)))
    drifted = {d.command_id: d for d in report.drifts}
    assert drifted["m2:evaluate"].rederived["outcome"] == "rollback"
    assert drifted["m2:evaluate"].rederived["reasons"] == ["gate_evidence_failed"]
