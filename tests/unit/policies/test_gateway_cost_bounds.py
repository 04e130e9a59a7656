"""Every request cost is finite or refused when computed; admission denies a route that cannot price
its grant, before any provider call; the route commands bound the figures that feed the costs."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from controlplane.commands.base import MAX_TOKENS
from controlplane.commands.gateway_specs import (
    MAX_BUSY_REQUESTS_PER_SECOND,
    MAX_COST_UNITS_PER_HOUR,
    MAX_PRICE_PER_TOKEN,
    MIN_BUSY_REQUESTS_PER_SECOND,
    MIN_UTILISATION,
    ServingEconomicsSpec,
    TokenPricesSpec,
)
from controlplane.policies.gateway import Step
from controlplane.policies.gateway_admission import admit
from controlplane.policies.gateway_worksheet import (
    ServingEconomics,
    TokenPrices,
    hosted_request_cost,
    request_cost,
    self_hosted_allocation,
)
from controlplane.policies.reasons import PolicyInputError
from tests.unit.policies.test_gateway_admission import SH1, VIEW, request

ECONOMICS = {"cost_units_per_hour": 10.0, "busy_requests_per_second": 20.0, "utilisation": 0.5}


@pytest.mark.parametrize("call", [
    lambda: hosted_request_cost(10, 10, 1.7e308, 1.7e308),
    lambda: self_hosted_allocation(10.0, 5e-324, 0.5),
    lambda: self_hosted_allocation(1.7e308, 1e-300, 1e-10),
], ids=["hosted_overflow", "served_underflows_to_zero", "allocation_overflow"])
def test_a_cost_that_is_not_finite_is_refused_with_a_typed_error(call: Any) -> None:
    with pytest.raises(PolicyInputError) as error:
        call()
    assert (error.value.code, error.value.field) == ("cost_not_finite", "cost_units")


def test_a_route_that_cannot_price_its_grant_is_denied_at_reserve_before_any_budget_moves() -> None:
    extreme = replace(SH1, economics=ServingEconomics(10.0, 5e-324, 0.5))
    admission = admit(request(), replace(VIEW, routes=(extreme, *VIEW.routes[1:])))
    assert admission.plan is None and admission.budget_after is None
    assert admission.denial is not None and admission.denial.step is Step.RESERVE
    assert admission.denial.code == "cost_not_finite"
    assert admission.denial.reasons[0].facts["route_id"] == "sh-1"


def test_a_route_priced_within_bounds_is_admitted_unchanged() -> None:
    priced = replace(SH1, economics=ServingEconomics(**ECONOMICS))
    assert admit(request(), replace(VIEW, routes=(priced, *VIEW.routes[1:]))) == admit(request(), VIEW)


@pytest.mark.parametrize(("spec", "fields"), [
    (TokenPricesSpec, {"input_price_per_token": MAX_PRICE_PER_TOKEN * 1.01, "output_price_per_token": 0.0}),
    (TokenPricesSpec, {"input_price_per_token": 0.0, "output_price_per_token": 1.7e308}),
    (ServingEconomicsSpec, {**ECONOMICS, "cost_units_per_hour": MAX_COST_UNITS_PER_HOUR * 1.01}),
    (ServingEconomicsSpec, {**ECONOMICS, "busy_requests_per_second": MIN_BUSY_REQUESTS_PER_SECOND / 2}),
    (ServingEconomicsSpec, {**ECONOMICS, "busy_requests_per_second": 5e-324}),
    (ServingEconomicsSpec, {**ECONOMICS, "busy_requests_per_second": MAX_BUSY_REQUESTS_PER_SECOND * 2}),
    (ServingEconomicsSpec, {**ECONOMICS, "utilisation": MIN_UTILISATION / 2}),
])
def test_route_pricing_outside_its_bounds_is_refused_by_the_command(spec: Any,
                                                                   fields: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        spec(**fields)


@settings(max_examples=200, deadline=None)
@given(input_price=st.floats(0, MAX_PRICE_PER_TOKEN), output_price=st.floats(0, MAX_PRICE_PER_TOKEN),
       cost_per_hour=st.floats(0, MAX_COST_UNITS_PER_HOUR),
       rate=st.floats(MIN_BUSY_REQUESTS_PER_SECOND, MAX_BUSY_REQUESTS_PER_SECOND),
       utilisation=st.floats(MIN_UTILISATION, 1.0))
def test_every_figure_the_commands_accept_prices_a_maximal_request_finitely(
        input_price: float, output_price: float, cost_per_hour: float, rate: float,
        utilisation: float) -> None:
    prices = TokenPricesSpec(input_price_per_token=input_price, output_price_per_token=output_price)
    economics = ServingEconomicsSpec(cost_units_per_hour=cost_per_hour, busy_requests_per_second=rate,
                                     utilisation=utilisation)
    hosted = request_cost(TokenPrices(**prices.model_dump()), None, MAX_TOKENS, MAX_TOKENS)
    self_hosted = request_cost(None, ServingEconomics(**economics.model_dump()), 0, 0)
    assert hosted is not None and self_hosted is not None
    assert math.isfinite(hosted.cost_units) and math.isfinite(self_hosted.cost_units)
