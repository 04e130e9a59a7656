"""`DecisionContext.read_outside`: read and recorded live; in replay, the recorded value (or
error) is used and the outside world is never read; a decision recorded before reads were
recorded is re-derived by reading it, recording nothing."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.decisions import OUTSIDE_READS, DecisionContext, OutsideReads, decision_data
from controlplane.policies.reasons import PolicyInputError
from controlplane.policy_book import PolicyBook


def context(outside: OutsideReads | None = None) -> DecisionContext:
    ctx = DecisionContext(state=None, read_position=7,  # type: ignore[arg-type]
                          stream_version=lambda _: 0, policies=PolicyBook(),
                          accepted_event_id=None)
    return ctx if outside is None else DecisionContext(
        ctx.state, ctx.read_position, ctx.stream_version, ctx.policies, None, outside=outside)


def record(ctx: DecisionContext) -> dict[str, Any]:
    return decision_data(outcome="done", reasons=[], result={}, policy=None,
                         inputs={"command_id": "c1"}, ctx=ctx)


def never_read() -> Any:
    raise AssertionError("the outside world was read in replay")


def unreadable() -> Any:
    raise PolicyInputError("catalog_unreadable", "catalog", "cannot read the catalog")


def test_a_live_read_is_recorded_in_the_decisions_inputs_as_plain_data() -> None:
    ctx = context()
    assert ctx.read_outside("catalog:m", lambda: {"layers": 32, "dims": (1, 2)}) == {
        "layers": 32, "dims": [1, 2]}
    assert record(ctx)["inputs"] == {"command_id": "c1", OUTSIDE_READS: {
        "catalog:m": {"value": {"layers": 32, "dims": [1, 2]}}}}


def test_a_decision_that_reads_nothing_outside_records_inputs_as_given() -> None:
    assert record(context())["inputs"] == {"command_id": "c1"}


def test_a_live_read_that_fails_is_recorded_and_raised() -> None:
    ctx = context()
    with pytest.raises(PolicyInputError) as raised:
        ctx.read_outside("catalog:m", unreadable)
    assert (raised.value.code, raised.value.field) == ("catalog_unreadable", "catalog")
    assert record(ctx)["inputs"][OUTSIDE_READS] == {"catalog:m": {"error": {
        "code": "catalog_unreadable", "field": "catalog", "message": "cannot read the catalog"}}}


def test_replay_returns_the_recorded_value_without_reading() -> None:
    live = context()
    live.read_outside("catalog:m", lambda: {"layers": 32})
    recorded = record(live)
    replayed = context(OutsideReads.recorded_by(recorded))
    assert replayed.read_outside("catalog:m", never_read) == {"layers": 32}
    assert record(replayed) == recorded


def test_replay_raises_the_recorded_error_without_reading() -> None:
    live = context()
    with pytest.raises(PolicyInputError):
        live.read_outside("catalog:m", unreadable)
    recorded = record(live)
    replayed = context(OutsideReads.recorded_by(recorded))
    with pytest.raises(PolicyInputError, match="cannot read the catalog") as raised:
        replayed.read_outside("catalog:m", never_read)
    assert raised.value.code == "catalog_unreadable"
    assert record(replayed) == recorded


def test_a_decision_recorded_before_reads_were_recorded_reads_today_and_records_nothing() -> None:
    legacy = {"outcome": "done", "inputs": {"command_id": "c1"}}
    replayed = context(OutsideReads.recorded_by(legacy))
    assert replayed.read_outside("catalog:m", lambda: {"layers": 40}) == {"layers": 40}
    assert record(replayed)["inputs"] == {"command_id": "c1"}
