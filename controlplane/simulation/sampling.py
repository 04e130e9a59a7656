"""The fleet over time: replicas and queues sampled at every control tick."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from controlplane.simulation.world import ReplicaState

if TYPE_CHECKING:
    from controlplane.simulation.fleet import Fleet

SERIES = ("ready_replicas", "warming_replicas", "draining_replicas", "admission_queue",
          "engine_waiting", "running")


@dataclass
class Samples:
    """Column-wise samples; `times_seconds[i]` is when row i was taken."""

    times_seconds: list[float] = field(default_factory=list)
    columns: dict[str, list[int]] = field(default_factory=lambda: {name: [] for name in SERIES})

    def take(self, now_seconds: float, fleet: Fleet, admission_queue: int) -> None:
        """Record the fleet as it stands at `now_seconds`."""
        ready = warming = draining = waiting = running = 0
        for replica in fleet.replicas.values():
            engine = replica.engine
            if replica.state is ReplicaState.READY:
                ready += 1
            elif replica.state is ReplicaState.WARMING:
                warming += 1
            elif not engine.idle:
                draining += 1
            waiting += len(engine.waiting)
            running += engine.running
        self.times_seconds.append(now_seconds)
        for name, value in zip(SERIES, (ready, warming, draining, admission_queue, waiting, running),
                               strict=True):
            self.columns[name].append(value)

    def maximum(self, name: str) -> int:
        return max(self.columns[name], default=0)

    def downsampled(self, points: int) -> dict[str, Any]:
        """At most `points` rows: each keeps the largest value of the ticks it stands for."""
        count = len(self.times_seconds)
        if count == 0:
            return {"times_seconds": [], **{name: [] for name in SERIES}}
        width = max(1, -(-count // points))
        starts = range(0, count, width)
        return {"times_seconds": [round(self.times_seconds[min(s + width, count) - 1], 3)
                                  for s in starts],
                **{name: [max(values[s:s + width]) for s in starts]
                   for name, values in self.columns.items()}}
