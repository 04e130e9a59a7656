"""A dispatch completes wherever the log's checkpoints fall (its mark is one event back)."""

from __future__ import annotations

import pytest

from controlplane.gateway.scenario import GatewayDriver, dispatch
from controlplane.runtime import store_for_process
from events.verify import verify_log


def test_a_dispatch_whose_mark_lands_on_a_checkpoint_completes_and_is_sent_once(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a checkpoint after every append, every mark lands on one: the mark unpacked the one
    event it appended and failed (ValueError) when the append also returned the checkpoint, one
    dispatch in a thousand, left reserved and never sent."""
    monkeypatch.setattr(store_for_process(gateway.settings), "checkpoint_every", 1)
    response = gateway.send(dispatch("alice", "k1"))
    assert (response["outcome"], response["replayed"]) == ("completed", False)
    assert gateway.calls(tenant="acme", key="k1") == 1
    operation = gateway.operation("acme", "k1")
    assert operation is not None and operation["state"] == "completed"
    assert verify_log(gateway.store).ok
