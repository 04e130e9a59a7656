"""The decisions benchmark's goal lines: growth with workers must clear the machine's noise."""

from __future__ import annotations

import argparse

import pytest

from bench.common import Measurement, count
from bench.decision_results import GROWTH, POSTGRES_REDIS, Results


def _postgres_runs(*rates: float) -> Results:
    results = Results()
    for workers, rate in zip((1, 2, 4), rates, strict=False):
        results.runs.append(Measurement("batched", POSTGRES_REDIS, str(workers), 20_000,
                                        20_000 / rate))
    return results


@pytest.mark.parametrize(("rates", "grows", "steps"), [
    ((1_000, 1_100, 1_210), True, [True, True]),
    ((1_839, 2_036, 2_070), False, [True, False]),  # 4 vs 2 workers 1.02: within noise
    ((1_000, 1_060, 1_120), True, [True, True]),
    ((1_000, 1_040, 1_500), False, [False, True]),
    ((1_000, 900, 1_500), False, [False, True]),
])
def test_more_workers_count_as_growth_only_past_the_noise_margin(
        rates: tuple[float, ...], grows: bool, steps: list[bool]) -> None:
    results = _postgres_runs(*rates)
    goal, met = results.goals()[-1]
    assert "grows with worker processes" in goal and met is grows
    assert [f.met for f in results.figures() if f.figure.endswith("workers")] == steps
    assert GROWTH == 1.05


def test_growth_is_not_measured_without_two_postgresql_runs() -> None:
    assert _postgres_runs(1_000).goals()[-1][1] is None


@pytest.mark.parametrize(("value", "message"), [
    ("0", "0 is below the least allowed, 1"),
    ("-3", "-3 is below the least allowed, 1"),
    ("x", "'x' is not a whole number"),
])
def test_a_benchmark_count_below_one_or_not_a_number_is_refused_by_name(
        value: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        count()(value)
    assert count()("7") == 7 and count(0)("0") == 0
