"""Report figures: nearest-rank percentiles, ordered and real; the chart is well-formed SVG."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ElementTree

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.metrics import p95_nearest_rank
from controlplane.simulation.chart import render_svg
from controlplane.simulation.report import nearest_rank, percentiles

LATENCIES = st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=200)


@settings(max_examples=80, deadline=None)
@given(values=LATENCIES)
def test_percentiles_are_ordered_and_p95_is_the_metrics_policys(values: list[float]) -> None:
    figures = percentiles(values)
    assert figures["p50"] <= figures["p95"] <= figures["p99"]  # type: ignore[operator]
    assert nearest_rank(values, 95) == p95_nearest_rank(values)
    assert all(value in values for value in map(lambda q: nearest_rank(values, q), (50, 95, 99)))


def test_nearest_rank_on_twenty_values_is_the_nineteenth() -> None:
    values = [float(v) for v in range(1, 21)]
    assert (nearest_rank(values, 50), nearest_rank(values, 95), nearest_rank(values, 99)) == (
        10.0, 19.0, 20.0)


def test_percentiles_of_no_requests_are_none_not_nan() -> None:
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}
    with pytest.raises(ValueError):
        nearest_rank([], 50)


def _report(times: list[float], ttft: list[float | None]) -> dict[str, object]:
    n = len(times)
    return {"trace": {"path": "/x/<trace>&.csv"}, "fleet": {"model": "m", "gpu": "g"},
            "config": {"routing": "prefix"},
            "timeline": {"times_seconds": times, "ready_replicas": [1] * n,
                         "warming_replicas": [0] * n, "admission_queue": [0] * n,
                         "engine_waiting": list(range(n)), "running": [2] * n,
                         "p95_ttft_seconds": ttft}}


@pytest.mark.parametrize(("times", "ttft"), [
    ([1.0, 2.0, 3.0, 4.0], [0.1, None, 0.3, 0.2]),
    ([5.0], [None]),
    ([], []),
])
def test_the_chart_is_well_formed_svg_with_finite_coordinates(times: list[float],
                                                              ttft: list[float | None]) -> None:
    root = ElementTree.fromstring(render_svg(_report(times, ttft)))
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    for element in root.iter():
        for name in ("x", "y", "cx", "cy", "width", "height"):
            if name in element.attrib:
                assert math.isfinite(float(element.attrib[name]))
        if "points" in element.attrib:
            coordinates = [float(c) for pair in element.attrib["points"].split() for c in pair.split(",")]
            assert all(math.isfinite(c) for c in coordinates)


def test_a_gap_in_latency_breaks_the_line_in_two() -> None:
    root = ElementTree.fromstring(render_svg(_report([1.0, 2.0, 3.0, 4.0, 5.0],
                                                     [0.1, 0.2, None, 0.3, 0.4])))
    first_colour = [e for e in root.iter() if e.attrib.get("stroke") == "#1f77b4"
           and e.tag.endswith("polyline")]
    # ready replicas, queue and the two halves of the latency line share the first colour
    assert len(first_colour) == 4
