"""The autoscaler's evidence and cadence in a simulation: one `ObserveLoad` per interval, until it rests.

Each observation carries the tokens that arrived over the last interval (per second) and the
tokens waiting (queued for admission or on a replica, not yet running). Through an idle stretch
the autoscaler is observed every interval until it rests: an observation of no arrivals and no
queue held because demand matched the desired count, which is then `min_replicas` (demand is
clamped to it). Every later observation of that stretch would repeat that hold, so none forces a
tick: the next is taken at the next tick that has work, and a 30-day gap costs a few decisions,
not 170,000. A pool above `min_replicas` is not at rest, so it still scales down once its
stabilisation window passes. Skipping the repeats changes no later decision: each would add a
minimum demand to the window, which never holds off a scale-down, and the resting observation
stays in the window to cover the stabilisation window.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from datetime import datetime

from controlplane.commands.traffic import ObserveLoad, TokenObservation
from controlplane.simulation.control import Decided
from controlplane.state.autoscaling import SCALE_DECIDED
from events.model import RecordedEvent


class AutoscalerFeed:
    """Builds the autoscaler's observations on the virtual clock and knows when it rests."""

    def __init__(self, pool_id: str, interval_seconds: float, arrivals: Sequence[tuple[float, int]],
                 at: Callable[[float], datetime]) -> None:
        self.pool_id, self.interval_seconds, self.at = pool_id, interval_seconds, at
        self.arrival_times = [when for when, _ in arrivals]
        self.arrival_tokens = list(itertools.accumulate((tokens for _, tokens in arrivals),
                                                        initial=0))
        self.next_seconds = interval_seconds
        self.observations = 0
        self.observed_arrivals = 0  # arrivals admitted before the last observation
        self.rests = False  # the last decision was a resting hold (see `resting`)

    def due(self, now: float) -> bool:
        return now >= self.next_seconds

    def observe(self, now: float, queued_tokens: int, arrivals_admitted: int) -> ObserveLoad:
        """The observation at `now`: arrivals over the last interval, the tokens waiting."""
        window = self.interval_seconds
        self.next_seconds = now + window
        self.observed_arrivals = arrivals_admitted
        start = bisect.bisect_left(self.arrival_times, now - window)
        stop = bisect.bisect_left(self.arrival_times, now)
        arrived = self.arrival_tokens[stop] - self.arrival_tokens[start]
        self.observations += 1
        return ObserveLoad(command_id=f"observe-{self.observations}", at=self.at(now),
                           actor="autoscaler", pool_id=self.pool_id, observations=[TokenObservation(
                               observed_at=self.at(now), queued_tokens=queued_tokens,
                               arrival_tokens_per_second=round(arrived / window, 3))])

    def decided(self, item: Decided) -> None:
        """Follow an `ObserveLoad` decision: does the autoscaler rest after it?"""
        self.rests = resting(item.first(SCALE_DECIDED))

    def at_rest(self, queued_tokens: Callable[[], int], arrivals_admitted: int) -> bool:
        """Whether the next observation would repeat the last resting hold: nothing arrived and
        nothing waits since (only a decision changes the desired count; the next tick sees it).
        The waiting tokens are counted only when the rest could hold: this runs every tick."""
        return self.rests and arrivals_admitted == self.observed_arrivals and queued_tokens() == 0


def resting(decided: RecordedEvent | None) -> bool:
    """A decision every later idle observation would repeat: a hold because demand matches the
    desired count, on an observation of no arrivals and no queued tokens."""
    if decided is None or decided.data["outcome"] != "hold":
        return False
    observed = decided.data["result"]["observations"]
    return decided.data["reasons"][0]["code"] == "demand_matches_desired" and all(
        o["queued_tokens"] == 0 and o["arrival_tokens_per_second"] == 0 for o in observed)
