"""The course worksheet's arithmetic: latency before persistence, and per-request economics.

These are planning figures, not measurements: each result names its assumptions in its reasons.
Every cost is a finite number or a `PolicyInputError` (`cost_not_finite`): a cost the log cannot
record is refused when it is computed, never discovered after a provider has done the work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controlplane.policies.reasons import Reason, require

SECONDS_PER_HOUR = 3_600


def _finite_at_least(value: float, floor: float, field: str, strict: bool = False) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value > floor if strict else value >= floor))
    require(ok, "worksheet_value_out_of_range", field,
            f"{field} must be a finite number {'>' if strict else '>='} {floor}")


@dataclass(frozen=True)
class LatencyEstimate:
    outcome: str
    first_token_seconds: float
    decode_seconds: float
    total_before_persist_seconds: float
    reasons: tuple[Reason, ...]


def latency_before_persist(queue_seconds: float, prefill_seconds: float, output_tokens: int,
                           seconds_per_output_token: float) -> LatencyEstimate:
    """Queue/verification/retrieval plus prefill plus decode: when the answer can first be saved."""
    _finite_at_least(queue_seconds, 0, "queue_seconds")
    _finite_at_least(prefill_seconds, 0, "prefill_seconds")
    _finite_at_least(seconds_per_output_token, 0, "seconds_per_output_token")
    require(isinstance(output_tokens, int) and not isinstance(output_tokens, bool)
            and output_tokens >= 0, "worksheet_value_out_of_range", "output_tokens",
            "output_tokens must be a non-negative integer")
    first_token = queue_seconds + prefill_seconds
    decode = output_tokens * seconds_per_output_token
    total = first_token + decode
    reason = Reason("latency_estimated", "assumed latencies summed; not a benchmark",
                    {"queue_seconds": queue_seconds, "prefill_seconds": prefill_seconds,
                     "output_tokens": output_tokens,
                     "seconds_per_output_token": seconds_per_output_token,
                     "first_token_seconds": first_token, "decode_seconds": decode,
                     "total_before_persist_seconds": total})
    return LatencyEstimate("estimated", first_token, decode, total, (reason,))


def _finite_cost(cost: float) -> None:
    require(math.isfinite(cost), "cost_not_finite", "cost_units",
            "the request's cost is not a finite number; the route's pricing is out of range")


@dataclass(frozen=True)
class TokenPrices:
    """A hosted route's tariff in cost units per token."""

    input_price_per_token: float
    output_price_per_token: float


@dataclass(frozen=True)
class ServingEconomics:
    """A self-hosted replica's cost per hour and the requests it serves while busy."""

    cost_units_per_hour: float
    busy_requests_per_second: float
    utilisation: float


@dataclass(frozen=True)
class RequestCost:
    outcome: str
    cost_units: float
    reasons: tuple[Reason, ...]


def hosted_request_cost(input_tokens: int, output_tokens: int, input_price_per_token: float,
                        output_price_per_token: float) -> RequestCost:
    """Input tokens times the input price plus output tokens times the output price."""
    for name, tokens in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
        require(isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0,
                "worksheet_value_out_of_range", name, f"{name} must be a non-negative integer")
    _finite_at_least(input_price_per_token, 0, "input_price_per_token")
    _finite_at_least(output_price_per_token, 0, "output_price_per_token")
    cost = input_tokens * input_price_per_token + output_tokens * output_price_per_token
    _finite_cost(cost)
    return RequestCost("priced", cost, (Reason(
        "hosted_cost", "priced at the provider's per-token rates on actual usage",
        {"input_tokens": input_tokens, "output_tokens": output_tokens,
         "input_price_per_token": input_price_per_token,
         "output_price_per_token": output_price_per_token, "cost_units": cost}),))


def self_hosted_allocation(cost_units_per_hour: float, busy_requests_per_second: float,
                           utilisation: float) -> RequestCost:
    """Infrastructure cost per successful request: C / (3,600 x q x u), before costs left out of C."""
    _finite_at_least(cost_units_per_hour, 0, "cost_units_per_hour")
    _finite_at_least(busy_requests_per_second, 0, "busy_requests_per_second", strict=True)
    _finite_at_least(utilisation, 0, "utilisation", strict=True)
    require(utilisation <= 1, "worksheet_value_out_of_range", "utilisation",
            "utilisation must be at most 1")
    served_per_hour = SECONDS_PER_HOUR * busy_requests_per_second * utilisation
    # A rate so small that the product underflows to 0 serves nobody: an infinite cost, refused.
    cost = cost_units_per_hour / served_per_hour if served_per_hour > 0 else math.inf
    _finite_cost(cost)
    return RequestCost("allocated", cost, (Reason(
        "self_hosted_allocation", "replica cost spread over the requests it actually serves",
        {"cost_units_per_hour": cost_units_per_hour,
         "busy_requests_per_second": busy_requests_per_second, "utilisation": utilisation,
         "served_requests_per_hour": served_per_hour, "cost_units": cost}),))


def request_cost(prices: TokenPrices | None, economics: ServingEconomics | None, input_tokens: int,
                 output_tokens: int) -> RequestCost | None:
    """A route's cost of one request: per-token prices if it has them, else its economics, else None."""
    if prices is not None:
        return hosted_request_cost(input_tokens, output_tokens, prices.input_price_per_token,
                                   prices.output_price_per_token)
    if economics is not None:
        return self_hosted_allocation(economics.cost_units_per_hour,
                                      economics.busy_requests_per_second, economics.utilisation)
    return None
