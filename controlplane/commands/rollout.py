"""Rollout commands: start a staged rollout, record canary evidence, evaluate the stage (spec 1.11).

Requirements are declared when the rollout starts (or taken from the rollout policy then), apart
from and before any measurement, so no measurement can set its own threshold.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, model_validator

from controlplane.commands.base import CommandBase, Frozen, Name
from controlplane.policy_book import RolloutParameters

Score = Annotated[float, Field(strict=True, ge=0, le=1_000_000, allow_inf_nan=False)]
Seconds = Annotated[float, Field(strict=True, ge=0, le=3_600, allow_inf_nan=False)]
Throughput = Annotated[float, Field(strict=True, gt=0, le=1_000_000_000, allow_inf_nan=False)]
TokenId = Annotated[int, Field(strict=True, ge=0, le=10_000_000)]


class ReleaseMeasurementSpec(Frozen):
    """What one release measured under one traffic mode."""

    revision: Name
    mode: Literal["shadow", "canary"]
    warmed: StrictBool
    sample_count: Annotated[int, Field(strict=True, ge=0, le=1_000_000_000_000)]
    quality_score: Score
    p95_ttft_seconds: Seconds
    p95_tpot_seconds: Seconds
    output_tokens_per_second: Throughput
    error_rate: Score


class QuantizationRequirementsSpec(Frozen):
    """The quantization gate's trusted thresholds (spec 1.5)."""

    min_quality_score: Score
    max_quality_drop: Score
    max_weight_memory_gib: Annotated[float, Field(strict=True, ge=0, le=1_000_000,
                                                  allow_inf_nan=False)]
    max_p95_ttft_seconds: Seconds
    min_relative_throughput: Score


class QuantizationMeasurementSpec(Frozen):
    name: Name
    weight_bits: Annotated[int, Field(strict=True, gt=0, le=64)]
    hardware_supported: StrictBool
    quality_score: Score
    weight_memory_gib: Annotated[float, Field(strict=True, gt=0, le=1_000_000, allow_inf_nan=False)]
    p95_ttft_seconds: Seconds
    output_tokens_per_second: Throughput


class QuantizationEvidence(Frozen):
    """Measured baseline and quantized candidate formats; judged by the quantization gate."""

    baseline: QuantizationMeasurementSpec
    candidate: QuantizationMeasurementSpec


class SpeculationCostsSpec(Frozen):
    baseline_seconds_per_token: Annotated[float, Field(strict=True, gt=0, le=3_600,
                                                       allow_inf_nan=False)]
    draft_seconds_per_token: Annotated[float, Field(strict=True, gt=0, le=3_600, allow_inf_nan=False)]
    verification_seconds_per_round: Annotated[float, Field(strict=True, gt=0, le=3_600,
                                                           allow_inf_nan=False)]


class SpeculationRoundSpec(Frozen):
    draft_tokens: Annotated[list[TokenId], Field(min_length=1, max_length=64)]
    target_tokens: Annotated[list[TokenId], Field(min_length=2, max_length=65)]

    @model_validator(mode="after")
    def _target_covers_the_bonus_position(self) -> SpeculationRoundSpec:
        # Checkable from the round alone, so refused at submit (spec: the target covers every
        # drafted position plus the one after it), not recorded as a rejection.
        if len(self.target_tokens) <= len(self.draft_tokens):
            raise ValueError("target_tokens must be longer than draft_tokens: the target covers "
                             "every drafted position plus the one after it")
        return self


class SpeculationEvidence(Frozen):
    """Measured speculative-decoding rounds and costs; judged by the speculation gate."""

    rounds: Annotated[list[SpeculationRoundSpec], Field(min_length=1, max_length=10_000)]
    costs: SpeculationCostsSpec


class StartRollout(CommandBase):
    """Begin a staged rollout of a candidate release in a pool: warmup at zero traffic first."""

    type: Literal["StartRollout"] = "StartRollout"
    rollout_id: Name
    pool_id: Name
    baseline_revision: Name
    candidate_revision: Name
    requirements: RolloutParameters | None = None
    quantization_requirements: QuantizationRequirementsSpec | None = None

    def references(self) -> list[tuple[str, str]]:
        return [("pool_id", f"pool/{self.pool_id}")]

    def creates(self) -> list[str]:
        return [f"rollout/{self.rollout_id}"]


class RecordCanaryMeasurement(CommandBase):
    """Record baseline and candidate evidence (and optional gate evidence) for a rollout.

    Its decision issues `EvaluateCanary` for this measurement; the command id names the evidence.
    """

    type: Literal["RecordCanaryMeasurement"] = "RecordCanaryMeasurement"
    rollout_id: Name
    baseline: ReleaseMeasurementSpec
    candidate: ReleaseMeasurementSpec
    quantization: QuantizationEvidence | None = None
    speculation: SpeculationEvidence | None = None

    def references(self) -> list[tuple[str, str]]:
        return [("rollout_id", f"rollout/{self.rollout_id}")]


class EvaluateCanary(CommandBase):
    """Decide a rollout's stage from recorded evidence: hold, advance, promote or roll back."""

    type: Literal["EvaluateCanary"] = "EvaluateCanary"
    rollout_id: Name
    measurement_id: Name | None = None  # the latest measurement when omitted

    def references(self) -> list[tuple[str, str]]:
        return [("rollout_id", f"rollout/{self.rollout_id}")]


COMMANDS: list[type[CommandBase]] = [StartRollout, RecordCanaryMeasurement, EvaluateCanary]
