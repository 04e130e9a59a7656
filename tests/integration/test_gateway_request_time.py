"""A request is dated now: its time starts its reservation's lease on the command clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.errors import SubmissionRejected
from controlplane.gateway.scenario import GatewayDriver, dispatch
from controlplane.handlers.gateway import MAX_DISPATCH_AHEAD_SECONDS


def test_a_request_dated_ahead_of_the_control_planes_clock_is_refused_at_submit(
        gateway: GatewayDriver) -> None:
    """Dated in year 9999 and stuck, its operation could be reconciled only by a
    reconciliation dated past it plus the lease: late in 9999, never, its grant held forever."""
    head = gateway.store.head()
    with pytest.raises(SubmissionRejected) as refused:
        gateway.run(dispatch("alice", "far", at=datetime(9999, 12, 31, 23, tzinfo=UTC)))
    assert [p.field for p in refused.value.problems] == ["at"]
    assert "ahead of the control plane's clock" in refused.value.problems[0].message
    assert gateway.store.head() == head and gateway.calls(tenant="acme", key="far") == 0


def test_a_request_from_a_clock_running_a_little_fast_is_served(gateway: GatewayDriver) -> None:
    soon = datetime.now(UTC) + timedelta(seconds=MAX_DISPATCH_AHEAD_SECONDS - 60)
    assert gateway.send(dispatch("alice", "soon", at=soon))["outcome"] == "completed"
