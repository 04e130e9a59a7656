"""The gateway's readers of folded state never crash on a row an older log may hold."""

from __future__ import annotations

from controlplane.commands.gateway import Dispatch
from controlplane.decisions import DecisionContext
from controlplane.gateway.world import tenant_of, tenants_drawing_on
from controlplane.handlers.gateway import handle_dispatch
from controlplane.policy_book import PolicyBook
from controlplane.state import gateway as gw
from events.projections import MemoryProjections


def state_with_a_tenant_row_without_its_budget() -> MemoryProjections:
    """As `SetNetworkPolicy` once left a tenant whose registration was refused."""
    state = MemoryProjections()
    state.put(gw.REGISTRIES["tenant"], "b", {"network_policy": "private_only", "event_id": "e1"})
    state.put(gw.REGISTRIES["tenant"], "acme", {"tenant_id": "acme", "network_policy": "private_only",
                                                "budget_id": "shared-1", "event_id": "e2"})
    state.put(gw.REGISTRIES["principal"], "pb", {"principal_id": "pb", "tenant_id": "b",
                                                 "active": True, "event_id": "e3"})
    return state


def test_a_tenant_row_without_its_budget_reads_as_no_tenant() -> None:
    state = state_with_a_tenant_row_without_its_budget()
    assert tenant_of(state, "b") is None
    assert tenants_drawing_on(state, "shared-1") == frozenset({"acme"})


def test_a_request_for_a_tenant_row_without_its_budget_is_denied_as_an_unknown_tenant() -> None:
    state = state_with_a_tenant_row_without_its_budget()
    ctx = DecisionContext(state, 0, lambda stream_id: 0, PolicyBook(), None)
    request = Dispatch(tenant="b", principal_id="pb", idempotency_key="x1",
                       pointer_name="acme/assistant", input="hello")
    [decision] = handle_dispatch(request, ctx)
    [event] = decision.events
    assert event.event_type == gw.DISPATCH_DENIED
    assert (event.data["result"]["step"], event.data["result"]["code"]) == \
        ("authorise", "tenant_unknown")
