"""A route whose pricing cannot give a finite cost is denied at reserve, before any provider call,
with nothing reserved; a priced route records the cost of the answer it saved.

Commands can no longer carry such pricing (tests/fuzz/test_secrets_and_bounds.py), so the extreme
routes here are recorded as a log written before the bounds would hold them.
"""

from __future__ import annotations

import pytest

from controlplane.commands.gateway import ConfigureRoute
from controlplane.commands.gateway_specs import ServingEconomicsSpec, TokenPricesSpec
from controlplane.decisions import DecisionContext
from controlplane.gateway.scenario import GatewayDriver, dispatch, route
from controlplane.handlers.gateway_config import handle_configure_route
from controlplane.policy_book import PolicyBook
from controlplane.state import gateway as gw
from controlplane.state.fold import apply_event
from events.store import EventStore


def record_unbounded_route(store: EventStore, command: ConfigureRoute) -> None:
    """Decide `command` without validating it, as the route handler did before pricing was bounded."""
    with store.transaction() as tx:
        ctx = DecisionContext(tx.projections, tx.head_position, tx.stream_version, PolicyBook(), None)
        for event in tx.append(handle_configure_route(command, ctx)):
            apply_event(tx.projections, event)


def _extreme_prices() -> TokenPricesSpec:
    return TokenPricesSpec.model_construct(input_price_per_token=1.7e308, output_price_per_token=1.7e308)


def _extreme_economics() -> ServingEconomicsSpec:
    return ServingEconomicsSpec.model_construct(cost_units_per_hour=10.0, busy_requests_per_second=5e-324,
                                                utilisation=0.5)


@pytest.mark.parametrize(("principal", "route_id", "pricing"), [
    ("carol", "hc-1", {"prices": _extreme_prices()}),
    ("alice", "sh-1", {"economics": _extreme_economics()}),
], ids=["hosted_price_overflows", "self_hosted_rate_underflows"])
def test_a_route_that_cannot_price_its_grant_is_denied_before_any_call_with_nothing_reserved(
        gateway: GatewayDriver, principal: str, route_id: str, pricing: dict[str, object]) -> None:
    if route_id == "hc-1":
        gateway.run(route("sh-1", ready=False))  # so beta's request selects the hosted route
    record_unbounded_route(gateway.store, route(route_id).model_copy(update=pricing))
    budget = gateway.budget()
    request = dispatch(principal, "k-unpriced")
    response = gateway.send(request)
    assert (response["outcome"], response["step"], response["code"]) == ("denied", "reserve",
                                                                         "cost_not_finite")
    tenant = request.tenant
    assert gateway.operation(tenant, "k-unpriced") is None
    assert gateway.stream_types(tenant, "k-unpriced") == [gw.DISPATCH_DENIED]
    assert gateway.calls() == 0 and gateway.budget() == budget


def test_a_priced_route_records_the_cost_of_the_answer_it_saved(gateway: GatewayDriver) -> None:
    economics = ServingEconomicsSpec(cost_units_per_hour=10.0, busy_requests_per_second=20.0,
                                     utilisation=0.5)
    gateway.run(route("sh-1", economics=economics))
    request = dispatch("alice", "k-priced")
    assert gateway.send(request)["outcome"] == "completed"
    saved = next(e for e in gateway.store.events_for_command(request.command_id)
                 if e.event_type == gw.OPERATION_COMPLETED)
    assert saved.data["result"]["cost"]["basis"] == "allocated"
    assert saved.data["result"]["cost"]["cost_units"] == pytest.approx(10 / 36_000)
