"""A staged rollout driven through the log by what the simulated arms measure (spec §1.11).

The candidate release runs on the same engines as the baseline (the data plane models no
regression of its own); its requests carry the candidate's cache scope. In warmup and shadow
the candidate serves no user traffic and its evidence is the mirrored baseline service;
in canary it serves the share the last stage decision gave it. Quality is not modelled
(both arms score 1.0); the error rate is the arm's shed share.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from controlplane.commands.base import CommandBase
from controlplane.commands.rollout import (
    RecordCanaryMeasurement,
    ReleaseMeasurementSpec,
    StartRollout,
)
from controlplane.policies.metrics import p95_nearest_rank
from controlplane.policy_book import RolloutParameters
from controlplane.simulation.config import SimulationConfig
from controlplane.simulation.control import Decided
from controlplane.simulation.world import RequestState
from controlplane.state.rollout import ROLLOUT_STARTED, STAGE_DECISIONS

ROLLOUT_ID = "canary-1"
MAX_SECONDS = 3_600.0  # the measurement contract's bound on a latency figure
_HASH_MULTIPLIER, _HASH_SPACE = 2_654_435_761, 2 ** 32
FINISHED = ("promoted", "rolled_back")


class RolloutDriver:
    """Starts the rollout, records one measurement per interval and follows the stage decisions."""

    def __init__(self, config: SimulationConfig, model_id: str, start_seconds: float) -> None:
        self.config = config
        self.baseline_revision = f"{model_id}@r1"
        self.candidate_revision = f"{model_id}@r2"
        self.next_seconds = start_seconds
        self.started_seconds: float | None = None
        self.stage: str | None = None
        self.candidate_percent = 0.0
        self.transitions: list[dict[str, Any]] = []
        self.measurements = 0
        self._completed: list[RequestState] = []
        self._shed: list[RequestState] = []

    def arm_for(self, request_index: int) -> str:
        """The candidate's share of requests, chosen by a fixed hash of the request's index."""
        bucket = (request_index * _HASH_MULTIPLIER) % _HASH_SPACE * 100 / _HASH_SPACE
        return "candidate" if bucket < self.candidate_percent else "baseline"

    def revision(self, arm: str) -> str:
        return self.candidate_revision if arm == "candidate" else self.baseline_revision

    def completed(self, request: RequestState) -> None:
        if self.stage not in FINISHED and self.stage is not None:
            self._completed.append(request)

    def shed(self, request: RequestState) -> None:
        if self.stage not in FINISHED and self.stage is not None:
            self._shed.append(request)

    def due(self, now_seconds: float) -> bool:
        return self.stage not in FINISHED and now_seconds >= self.next_seconds

    def commands(self, now_seconds: float, at: datetime) -> list[CommandBase]:
        """The rollout's command for this tick: its start, or the interval's evidence."""
        self.next_seconds = now_seconds + self.config.rollout_interval_seconds
        if self.stage is None:
            requirements = RolloutParameters(
                min_sample_count=self.config.canary_min_samples,
                canary_traffic_percents=list(self.config.canary_traffic_percents))
            return [StartRollout(command_id="rollout-start", at=at, actor="simulation",
                                 rollout_id=ROLLOUT_ID, pool_id=self.config.pool_id,
                                 baseline_revision=self.baseline_revision,
                                 candidate_revision=self.candidate_revision,
                                 requirements=requirements)]
        baseline = self._measure("baseline")
        if baseline is None:
            return []
        candidate = self._candidate(baseline, now_seconds)
        self._completed, self._shed = [], []
        if candidate is None:
            return []
        self.measurements += 1
        return [RecordCanaryMeasurement(
            command_id=f"measure-{self.measurements}", at=at, actor="simulation",
            rollout_id=ROLLOUT_ID, baseline=ReleaseMeasurementSpec(**baseline),
            candidate=ReleaseMeasurementSpec(**candidate))]

    def observe(self, decided: list[Decided], now_seconds: float) -> None:
        """Follow the rollout's recorded stage and candidate traffic share."""
        for item in decided:
            for event in item.of_type(ROLLOUT_STARTED, *STAGE_DECISIONS):
                result = event.data["result"]
                if event.event_type == ROLLOUT_STARTED:
                    self.stage, self.started_seconds = result["stage"], now_seconds
                    continue
                self.stage = result["to_stage"]
                self.candidate_percent = float(result["candidate_traffic_percent"])
                if result["action"] != "hold":
                    self.transitions.append({"at_seconds": now_seconds, "action": result["action"],
                                             "to_stage": self.stage,
                                             "candidate_traffic_percent": self.candidate_percent})

    def _measure(self, arm: str) -> dict[str, Any] | None:
        served = [r for r in self._completed if r.arm == arm]
        shed = sum(1 for r in self._shed if r.arm == arm)
        if not served:
            return None
        busy_seconds = sum(r.e2e_seconds for r in served)
        return {"revision": self.revision(arm), "mode": self._mode(), "warmed": True,
                "sample_count": len(served),
                "quality_score": 1.0,
                "p95_ttft_seconds": min(MAX_SECONDS, p95_nearest_rank([r.ttft_seconds for r in served])),
                "p95_tpot_seconds": min(MAX_SECONDS, p95_nearest_rank([r.tpot_seconds for r in served])),
                "output_tokens_per_second": sum(r.trace.output_tokens for r in served)
                / max(busy_seconds, 1e-6),
                "error_rate": shed / (shed + len(served))}

    def _candidate(self, baseline: dict[str, Any], now_seconds: float) -> dict[str, Any] | None:
        if self.stage in ("warmup", "shadow"):
            assert self.started_seconds is not None
            warmed = now_seconds - self.started_seconds >= self.config.warmup_seconds
            return {**baseline, "revision": self.candidate_revision, "warmed": warmed}
        return self._measure("candidate")

    def _mode(self) -> str:
        return "shadow" if self.stage in ("warmup", "shadow") else "canary"

    def summary(self) -> dict[str, Any]:
        return {"rollout_id": ROLLOUT_ID, "stage": self.stage, "measurements": self.measurements,
                "candidate_traffic_percent": self.candidate_percent, "transitions": self.transitions}
