"""The shared budget guard: reservation before transport, settlement after (spec §8)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.gateway_budget import BudgetState, reconfigure, release, reserve, settle
from controlplane.policies.reasons import PolicyInputError, to_plain

SHARED = BudgetState("shared-1", 10_000)


def test_a_reservation_that_exactly_fills_the_budget_is_allowed() -> None:
    verdict, after = reserve(BudgetState("b", 10_000, reserved_units=9_644), 356)
    assert verdict.allowed and after is not None
    assert (after.reserved_units, after.available_units) == (10_000, 0)


def test_quota_exceeded_leaves_the_budget_exactly_as_it_was() -> None:
    before = BudgetState("shared-1", 10_000, reserved_units=9_900)
    verdict, after = reserve(before, 356)
    assert verdict.code == "quota_exceeded" and after == before
    assert verdict.reasons[0].facts["available_units"] == 100
    assert verdict.reasons[0].facts["units"] == 356


def test_committed_units_count_against_the_limit_too() -> None:
    verdict, _ = reserve(BudgetState("b", 1_000, reserved_units=300, committed_units=400), 301)
    assert verdict.code == "quota_exceeded"


def test_no_budget_fails_closed() -> None:
    verdict, after = reserve(None, 1)
    assert verdict.code == "budget_not_configured" and after is None


def test_settlement_commits_usage_and_releases_the_remainder() -> None:
    _, held = reserve(SHARED, 356)
    assert held is not None
    movement = settle(held, 356, 150)
    assert (movement.committed_units, movement.released_units) == (150, 206)
    assert movement.after == BudgetState("shared-1", 10_000, 0, 150)
    full = settle(held, 356, 356)
    assert full.after.committed_units == 356 and full.released_units == 0


def test_usage_above_the_grant_is_committed_and_flagged() -> None:
    movement = settle(BudgetState("b", 1_000, reserved_units=100), 100, 120)
    assert movement.after.committed_units == 120
    assert [r.code for r in movement.reasons] == ["grant_settled", "usage_exceeded_grant"]


def test_release_returns_the_whole_grant() -> None:
    movement = release(BudgetState("b", 1_000, reserved_units=356), 356)
    assert movement.after.reserved_units == 0 and movement.released_units == 356


def test_a_grant_larger_than_what_is_reserved_is_refused() -> None:
    with pytest.raises(PolicyInputError) as error:
        release(BudgetState("b", 1_000, reserved_units=10), 11)
    assert (error.value.code, error.value.field) == ("grant_exceeds_reserved", "grant_units")


def test_negative_or_non_integer_units_are_refused() -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(PolicyInputError) as error:
            reserve(SHARED, bad)  # type: ignore[arg-type]
        assert error.value.code == "units_not_a_count"


def test_reconfiguring_keeps_reservations_and_commitments() -> None:
    current = BudgetState("b", 1_000, 300, 200)
    assert reconfigure(current, "b", 5_000) == BudgetState("b", 5_000, 300, 200)
    assert reconfigure(None, "b", 7) == BudgetState("b", 7)
    assert to_plain(current) == {"budget_id": "b", "limit_units": 1_000, "reserved_units": 300,
                                 "committed_units": 200}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["reserve", "settle", "release"]),
                          st.integers(0, 4_000), st.integers(0, 4_000)), max_size=40))
def test_no_sequence_of_movements_overspends_or_loses_units(
        steps: list[tuple[str, int, int]]) -> None:
    budget = SHARED
    grants: list[int] = []
    committed = 0
    for action, units, used in steps:
        if action == "reserve":
            verdict, after = reserve(budget, units)
            if verdict.allowed:
                assert after is not None
                budget = after
                grants.append(units)
        elif grants:
            grant = grants.pop(0)
            if action == "settle":
                used = min(used, grant)
                budget = settle(budget, grant, used).after
                committed += used
            else:
                budget = release(budget, grant).after
        assert budget.reserved_units + budget.committed_units <= budget.limit_units
        assert budget.reserved_units == sum(grants)
        assert budget.committed_units == committed
