"""Quantization staging gate on measured evidence only (spec §1.5).

Bit width is recorded but never used to estimate memory, latency or throughput: a lower precision
earns nothing until a measurement shows it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from controlplane.policies.gates import below, exceeds
from controlplane.policies.reasons import Reason, require


class QuantizationAction(StrEnum):
    STAGE = "stage"
    REJECT = "reject"


@dataclass(frozen=True)
class QuantizationMeasurement:
    """What one weight format measured on the target hardware and runtime."""

    name: str
    weight_bits: int
    hardware_supported: bool
    quality_score: float
    weight_memory_gib: float
    p95_ttft_seconds: float
    output_tokens_per_second: float


@dataclass(frozen=True)
class QuantizationRequirements:
    """Trusted policy, declared apart from any measurement."""

    min_quality_score: float
    max_quality_drop: float
    max_weight_memory_gib: float
    max_p95_ttft_seconds: float
    min_relative_throughput: float


@dataclass(frozen=True)
class QuantizationDecision:
    action: QuantizationAction
    quality_drop: float
    relative_throughput: float
    reasons: tuple[Reason, ...]


def _validate_measurement(measurement: QuantizationMeasurement, role: str) -> None:
    require(bool(measurement.name.strip()), "measurement_name_blank", f"{role}.name",
            "every measurement names its format")
    require(isinstance(measurement.hardware_supported, bool), "measurement_not_boolean",
            f"{role}.hardware_supported", "hardware support must be stated as true or false")
    for name in ("weight_bits", "quality_score", "weight_memory_gib", "p95_ttft_seconds",
                 "output_tokens_per_second"):
        require(math.isfinite(getattr(measurement, name)), "measurement_not_finite",
                f"{role}.{name}", f"{role} {name} must be finite")
    for name in ("weight_bits", "weight_memory_gib"):
        require(getattr(measurement, name) > 0, "measurement_not_positive", f"{role}.{name}",
                f"{role} {name} must be positive")
    require(measurement.p95_ttft_seconds >= 0, "measured_latency_negative",
            f"{role}.p95_ttft_seconds", f"{role} latency may not be negative")
    require(measurement.output_tokens_per_second > 0, "measured_throughput_not_positive",
            f"{role}.output_tokens_per_second", f"{role} throughput must be positive")


def _validate(baseline: QuantizationMeasurement, candidate: QuantizationMeasurement,
              requirements: QuantizationRequirements) -> None:
    _validate_measurement(baseline, "baseline")
    _validate_measurement(candidate, "candidate")
    for name in ("min_quality_score", "max_quality_drop", "max_weight_memory_gib",
                 "max_p95_ttft_seconds", "min_relative_throughput"):
        value = getattr(requirements, name)
        require(math.isfinite(value), "requirement_not_finite", f"requirements.{name}",
                f"{name} must be finite")
        require(value >= 0, "requirement_negative", f"requirements.{name}",
                f"{name} may not be negative")


def evaluate_quantization(baseline: QuantizationMeasurement, candidate: QuantizationMeasurement,
                          requirements: QuantizationRequirements) -> QuantizationDecision:
    """Stage the candidate only if every gate passes; every failing gate is named, in fixed order:
    kernel support, quality floor, quality regression, weight memory, p95 TTFT, throughput."""
    _validate(baseline, candidate, requirements)
    quality_drop = baseline.quality_score - candidate.quality_score
    relative_throughput = candidate.output_tokens_per_second / baseline.output_tokens_per_second
    # Finite measurements can still overflow (a quality drop of 1e308 - -1e308).
    require(math.isfinite(quality_drop) and math.isfinite(relative_throughput),
            "figures_not_finite", "candidate", "the measurements compare out of numeric range")
    failures: list[Reason] = []
    if not candidate.hardware_supported:
        failures.append(Reason("hardware_kernel_unsupported",
                               "the format has no kernel on the target hardware",
                               {"candidate": candidate.name}))
    if candidate.quality_score < requirements.min_quality_score:
        failures.append(Reason("quality_below_floor", "quality is under the absolute floor",
                               {"quality_score": candidate.quality_score,
                                "min_quality_score": requirements.min_quality_score}))
    if exceeds(quality_drop, requirements.max_quality_drop):
        failures.append(Reason("quality_regression_exceeds_allowance",
                               "quality fell further from the baseline than allowed",
                               {"quality_drop": quality_drop,
                                "max_quality_drop": requirements.max_quality_drop}))
    if candidate.weight_memory_gib > requirements.max_weight_memory_gib:
        failures.append(Reason("weight_memory_exceeds_budget",
                               "weights need more memory than budgeted",
                               {"weight_memory_gib": candidate.weight_memory_gib,
                                "max_weight_memory_gib": requirements.max_weight_memory_gib}))
    if candidate.p95_ttft_seconds > requirements.max_p95_ttft_seconds:
        failures.append(Reason("p95_ttft_exceeds_objective", "measured p95 TTFT is over objective",
                               {"p95_ttft_seconds": candidate.p95_ttft_seconds,
                                "max_p95_ttft_seconds": requirements.max_p95_ttft_seconds}))
    if below(relative_throughput, requirements.min_relative_throughput):
        failures.append(Reason("relative_throughput_below_requirement",
                               "measured throughput relative to baseline is too low",
                               {"relative_throughput": relative_throughput,
                                "min_relative_throughput": requirements.min_relative_throughput}))
    if failures:
        return QuantizationDecision(QuantizationAction.REJECT, quality_drop, relative_throughput,
                                    tuple(failures))
    passed = Reason("staging_gates_passed", "every measured staging gate passed",
                    {"candidate": candidate.name, "quality_drop": quality_drop,
                     "relative_throughput": relative_throughput})
    return QuantizationDecision(QuantizationAction.STAGE, quality_drop, relative_throughput,
                                (passed,))
