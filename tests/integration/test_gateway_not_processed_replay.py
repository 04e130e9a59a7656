"""A replay of an operation settled without being processed says so, and never sends it.

An operator's "not_processed" reconciliation, or a reservation settled before it was ever sent,
leaves the operation `failed` with its grant released. Nothing refused it: a replay answers the
typed `not_processed`, never `provider_refused`, and, as every replay, calls no provider (spec
G2: at most one call per key, ever; §4: a settled operation keeps its key; §13.3: a caller's
retry never re-opens a reconciliation).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.commands.gateway import ReconcileOperation
from controlplane.gateway.fixture_provider import Fault
from controlplane.gateway.scenario import GatewayDriver, dispatch, route
from controlplane.settings import Settings
from events import transaction
from tests.factories import wall_clock_after
from tests.integration.test_gateway_resume import decided_without_effects
from workers.pipeline import reconcile


def budget_figures(gateway: GatewayDriver) -> tuple[int, int]:
    budget = gateway.budget()
    return budget["reserved_units"], budget["committed_units"]


def not_processed(key: str, at: datetime | None = None) -> ReconcileOperation:
    return ReconcileOperation(tenant="acme", idempotency_key=key, resolution="not_processed",
                              evidence_ref="provider-ledger",
                              at=at if at is not None else datetime.now(UTC))


def test_a_replay_of_an_unknown_outcome_reconciled_not_processed_answers_not_processed(
        gateway: GatewayDriver) -> None:
    gateway.provider.script(Fault("timeout_after_send", idempotency_key="kn"))
    assert gateway.send(dispatch("alice", "kn"))["outcome"] == "outcome_unknown"
    gateway.run(not_processed("kn"))
    operation = gateway.operation("acme", "kn")
    assert operation is not None and (operation["state"], operation["outcome_code"]) == \
        ("failed", "not_processed")
    assert budget_figures(gateway) == (0, 0)

    replay = gateway.send(dispatch("alice", "kn"))

    assert (replay["outcome"], replay["code"], replay["replayed"], replay["answer"]) == \
        ("not_processed", "not_processed", True, None)
    assert gateway.calls(key="kn") == 1  # the one call made before the outcome was lost
    assert budget_figures(gateway) == (0, 0)
    assert gateway.operation("acme", "kn")["state"] == "failed"  # type: ignore[index]


def test_a_replay_of_a_reservation_reconciled_not_processed_answers_not_processed_unsent(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its worker died after the decision; past the lease the operator released the grant."""
    at = datetime.now(UTC)
    decided_without_effects(gateway, "kr", at=at)
    assert gateway.operation("acme", "kr")["state"] == "reserved"  # type: ignore[index]
    monkeypatch.setattr(transaction, "wall_clock", wall_clock_after(901))  # the lease runs out
    gateway.run(not_processed("kr", at + timedelta(seconds=901)))

    replay = gateway.send(dispatch("alice", "kr", at=at + timedelta(seconds=902)))

    assert (replay["outcome"], replay["replayed"], replay["answer"]) == ("not_processed", True, None)
    reconcile(Settings.from_env(), gateway.store)  # the job resumed late still sends nothing
    assert gateway.calls(key="kr") == 0 and budget_figures(gateway) == (0, 0)


def test_a_replay_of_a_reservation_settled_unsent_answers_not_processed(
        gateway: GatewayDriver) -> None:
    """Settled as `route_withdrawn` just before its call: no provider ever saw it."""
    at = datetime.now(UTC)
    decided_without_effects(gateway, "ku", at=at)
    gateway.run(route("sh-1", approved=False, at=at + timedelta(seconds=1)))
    reconcile(Settings.from_env(), gateway.store)
    operation = gateway.operation("acme", "ku")
    assert operation is not None and (operation["state"], operation["outcome_code"]) == \
        ("failed", "route_withdrawn")

    replay = gateway.send(dispatch("alice", "ku", at=at + timedelta(seconds=2)))

    assert (replay["outcome"], replay["replayed"], replay["answer"]) == ("not_processed", True, None)
    assert gateway.calls(key="ku") == 0 and budget_figures(gateway) == (0, 0)

