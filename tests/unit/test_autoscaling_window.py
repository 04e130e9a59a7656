"""The autoscaler's kept window: bounded, and merged without inventing demand."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.state.autoscaling import demand_of, next_window, window_bucket_seconds

DEMAND = {"min_replicas": 1, "max_replicas": 50, "service_tokens_per_second_per_replica": 100.0,
          "target_utilization": 1.0, "queue_drain_seconds": 10.0}
demand = demand_of(DEMAND)  # ceil(arrival / 100) + ceil(queued / 1,000), within 1..50


def observation(second: float, queued: int, arrival: float) -> dict[str, Any]:
    return {"timestamp_seconds": second, "queued_tokens": queued,
            "arrival_tokens_per_second": arrival}


def test_a_span_merges_into_its_observation_of_the_highest_demand_stamped_at_its_newest() -> None:
    window = [observation(0, 0, 0.0), observation(10, 2_000, 0.0), observation(20, 0, 200.0),
              observation(25, 0, 300.0), observation(30, 0, 0.0), observation(90, 0, 0.0)]
    kept = next_window(window, 0.0, 4, 60.0, demand)
    assert kept == [observation(0, 0, 0.0), observation(30, 0, 300.0), observation(90, 0, 0.0)]


def test_a_decision_recorded_before_demand_merging_folds_as_it_did_then() -> None:
    # Old logs' results hold no demand rule: their windows must fold to what their decisions saw.
    window = [observation(0, 0, 0.0), observation(10, 2_000, 0.0), observation(20, 0, 200.0),
              observation(30, 0, 0.0), observation(90, 0, 0.0)]
    kept = next_window(window, 0.0, 4, 60.0)
    assert kept[1] == observation(30, 2_000, 200.0)


observations = st.lists(st.builds(observation, st.integers(0, 600).map(float),
                                  st.integers(0, 20_000), st.integers(0, 2_000).map(float)),
                        min_size=1, max_size=80)


@settings(max_examples=200, deadline=None)
@given(observations, st.integers(4, 12), st.sampled_from([30.0, 60.0, 300.0]))
def test_the_kept_window_holds_only_real_observations_and_loses_no_peak(
        window: list[dict[str, Any]], limit: int, stabilization: float) -> None:
    newest = max(o["timestamp_seconds"] for o in window)
    keep_from = newest - stabilization
    kept = next_window(window, keep_from, limit, window_bucket_seconds(stabilization, limit),
                       demand)
    assert len(kept) <= limit
    real = {(o["queued_tokens"], o["arrival_tokens_per_second"]) for o in window}
    assert {(o["queued_tokens"], o["arrival_tokens_per_second"]) for o in kept} <= real
    # Inside the stabilisation window no demand is lost and none is invented: its peak is the
    # peak of what was observed from the window's start (a merged one may be stamped later).
    observed = [demand(o) for o in window if o["timestamp_seconds"] >= keep_from]
    inside = [demand(o) for o in kept if o["timestamp_seconds"] >= keep_from]
    assert max(inside) >= max(observed)
    assert max(demand(o) for o in kept) <= max(demand(o) for o in window)
