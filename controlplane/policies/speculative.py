"""Speculative decoding payback from measured draft/target agreement (spec §1.6).

One verification round checks k drafted tokens against the target model. The accepted prefix is
kept and the target always contributes one more token: the correction at the first mismatch, or
the bonus token at position k+1 when every draft was accepted. So a round emits 1..k+1 tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.policies.metrics import p95_nearest_rank
from controlplane.policies.reasons import Reason, require


@dataclass(frozen=True)
class SpeculationCosts:
    """Measured costs: target decoding alone, one drafted token, and one verification round."""

    baseline_seconds_per_token: float
    draft_seconds_per_token: float
    verification_seconds_per_round: float


@dataclass(frozen=True)
class SpeculationRound:
    """What the draft proposed and what the target verified for one round."""

    draft_tokens: tuple[int, ...]
    target_tokens: tuple[int, ...]


@dataclass(frozen=True)
class SpeculationDecision:
    enable: bool
    accepted_tokens: int
    drafted_tokens: int
    emitted_tokens: int
    acceptance_rate: float
    baseline_seconds: float
    speculative_seconds: float
    estimated_speedup: float
    reasons: tuple[Reason, ...]


@dataclass(frozen=True)
class SpeculationSummary:
    enable: bool
    rounds: int
    accepted_tokens: int
    drafted_tokens: int
    emitted_tokens: int
    acceptance_rate: float
    acceptance_by_position: tuple[float, ...]
    baseline_seconds: float
    speculative_seconds: float
    p95_round_seconds: float
    estimated_speedup: float
    reasons: tuple[Reason, ...]


def _validate_costs(costs: SpeculationCosts, minimum_speedup: float) -> None:
    for name, value in (("baseline_seconds_per_token", costs.baseline_seconds_per_token),
                        ("draft_seconds_per_token", costs.draft_seconds_per_token),
                        ("verification_seconds_per_round", costs.verification_seconds_per_round),
                        ("minimum_speedup", minimum_speedup)):
        require(math.isfinite(value), "cost_not_finite", name, f"{name} must be finite")
        require(value > 0, "cost_not_positive", name, f"{name} must be positive")


def _validate_round(draft_tokens: Sequence[int], target_tokens: Sequence[int], where: str) -> None:
    empty_field = "draft_tokens" if len(draft_tokens) == 0 else "target_tokens"
    require(len(draft_tokens) > 0 and len(target_tokens) > 0, "tokens_empty",
            f"{where}{empty_field}", "both the draft and the target token sequences are required")
    # The target must supply position k+1, or a fully accepted round has no bonus token to emit
    # (spec §9 bug 1).
    require(len(target_tokens) > len(draft_tokens), "target_missing_bonus_position",
            f"{where}target_tokens",
            "the target must cover every drafted position plus the one after it")


def _accepted_tokens(draft_tokens: Sequence[int], target_tokens: Sequence[int]) -> int:
    accepted = 0
    for drafted, verified in zip(draft_tokens, target_tokens, strict=False):
        if drafted != verified:
            break
        accepted += 1
    return accepted


def _gate(speedup: float, minimum_speedup: float, facts: dict[str, float | int]) -> Reason:
    # Finite costs can still overflow (1e308 s per token, or a 1e-320 s round).
    require(all(math.isfinite(value) for value in (speedup, *facts.values())),
            "figures_not_finite", "costs", "the costs give a speedup out of numeric range")
    facts = {**facts, "estimated_speedup": speedup, "minimum_speedup": minimum_speedup}
    if speedup >= minimum_speedup:
        return Reason("speedup_clears_gate",
                      f"measured speedup {speedup:.2f}x clears the {minimum_speedup:.2f}x gate",
                      facts)
    return Reason("speedup_misses_gate",
                  f"measured speedup {speedup:.2f}x misses the {minimum_speedup:.2f}x gate", facts)


def judge_measured_speedup(gate: Reason, minimum_speedup: float) -> tuple[bool, Reason]:
    """A recorded gate reason (`speedup_clears_gate` or `speedup_misses_gate`) judged again
    against `minimum_speedup`: the evidence measured once is judged by the minimum in force
    where it is used, so a what-if of the minimum changes the verdict. With the minimum it was
    recorded with, the same verdict and the same reason."""
    require(gate.code in ("speedup_clears_gate", "speedup_misses_gate"), "gate_not_speedup",
            "gates", f"{gate.code} is not a speculation speedup verdict")
    facts = {name: value for name, value in gate.facts.items()
             if name not in ("estimated_speedup", "minimum_speedup")}
    speedup = gate.facts["estimated_speedup"]
    reason = _gate(speedup, minimum_speedup, facts)
    return speedup >= minimum_speedup, reason


def evaluate_speculation(draft_tokens: Sequence[int], target_tokens: Sequence[int],
                         costs: SpeculationCosts,
                         minimum_speedup: float = 1.0) -> SpeculationDecision:
    """Enable speculation only if one measured round repays its cost; the gate is inclusive and
    a fully accepted round emits k+1 tokens."""
    _validate_round(draft_tokens, target_tokens, "")
    _validate_costs(costs, minimum_speedup)
    drafted = len(draft_tokens)
    accepted = _accepted_tokens(draft_tokens, target_tokens)
    emitted = accepted + 1
    # The baseline pays for the same emitted tokens that the round produced.
    baseline_seconds = emitted * costs.baseline_seconds_per_token
    speculative_seconds = (drafted * costs.draft_seconds_per_token
                           + costs.verification_seconds_per_round)
    speedup = baseline_seconds / speculative_seconds
    reason = _gate(speedup, minimum_speedup,
                   {"accepted_tokens": accepted, "drafted_tokens": drafted,
                    "emitted_tokens": emitted, "baseline_seconds": baseline_seconds,
                    "speculative_seconds": speculative_seconds})
    return SpeculationDecision(
        enable=speedup >= minimum_speedup,
        accepted_tokens=accepted,
        drafted_tokens=drafted,
        emitted_tokens=emitted,
        acceptance_rate=accepted / drafted,
        baseline_seconds=baseline_seconds,
        speculative_seconds=speculative_seconds,
        estimated_speedup=speedup,
        reasons=(reason,),
    )


def evaluate_speculation_rounds(rounds: Sequence[SpeculationRound], costs: SpeculationCosts,
                                minimum_speedup: float = 1.0) -> SpeculationSummary:
    """Judge speculation over many measured rounds; a malformed round fails the whole evaluation
    instead of being dropped, and the baseline covers exactly the tokens the rounds emitted."""
    require(len(rounds) > 0, "rounds_empty", "rounds", "at least one round is required")
    for index, measured in enumerate(rounds):
        _validate_round(measured.draft_tokens, measured.target_tokens, f"rounds[{index}].")
    _validate_costs(costs, minimum_speedup)
    longest_draft = max(len(measured.draft_tokens) for measured in rounds)
    drafted_at = [0] * longest_draft
    accepted_at = [0] * longest_draft
    round_seconds: list[float] = []
    accepted_total = drafted_total = 0
    for measured in rounds:
        drafted = len(measured.draft_tokens)
        accepted = _accepted_tokens(measured.draft_tokens, measured.target_tokens)
        for position in range(drafted):
            drafted_at[position] += 1
            accepted_at[position] += position < accepted
        accepted_total += accepted
        drafted_total += drafted
        round_seconds.append(drafted * costs.draft_seconds_per_token
                             + costs.verification_seconds_per_round)
    emitted_total = accepted_total + len(rounds)
    baseline_seconds = emitted_total * costs.baseline_seconds_per_token
    speculative_seconds = sum(round_seconds)
    speedup = baseline_seconds / speculative_seconds
    p95_round_seconds = p95_nearest_rank(round_seconds)
    reason = _gate(speedup, minimum_speedup,
                   {"rounds": len(rounds), "accepted_tokens": accepted_total,
                    "drafted_tokens": drafted_total, "emitted_tokens": emitted_total,
                    "baseline_seconds": baseline_seconds,
                    "speculative_seconds": speculative_seconds})
    return SpeculationSummary(
        enable=speedup >= minimum_speedup,
        rounds=len(rounds),
        accepted_tokens=accepted_total,
        drafted_tokens=drafted_total,
        emitted_tokens=emitted_total,
        acceptance_rate=accepted_total / drafted_total,
        acceptance_by_position=tuple(a / d for a, d in zip(accepted_at, drafted_at, strict=True)),
        baseline_seconds=baseline_seconds,
        speculative_seconds=speculative_seconds,
        p95_round_seconds=p95_round_seconds,
        estimated_speedup=speedup,
        reasons=(reason,),
    )
