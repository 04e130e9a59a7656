"""What a simulation run is asked to do; every default runs the Azure conversation trace whole."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.errors import InputError
from controlplane.policy_book import AutoscalingParameters
from controlplane.simulation.routing import Routing
from controlplane.simulation.traces import MAX_SPAN_SECONDS, Trace


def _autoscaling_bound(field: str) -> int:
    """The largest value the autoscaling policy accepts for `field` (its `le` bound)."""
    bounds = [item.le for item in AutoscalingParameters.model_fields[field].metadata
              if hasattr(item, "le")]
    assert len(bounds) == 1 and isinstance(bounds[0], int), f"autoscaling.{field} has no int bound"
    return bounds[0]


# The most replicas a run may name (--replicas, --min-replicas, --max-replicas). The simulation
# builds its fleet through the log, so it can build no more than the control plane accepts: it
# sets the autoscaling policy to these bounds (to the initial replicas with --no-autoscale),
# which is refused past this figure, and registers enough 8-GPU nodes for `max_replicas` at
# the replica's tensor-parallel width (at most 8: one node a replica). At the bound the worst
# build (Llama-3.1-405B on H200, 10,000 nodes and 10,000 replicas placed at the start) took
# under two minutes on 2 cores. Past it a run could be refused only once its log existed, and
# a value like 10**12 hung registering nodes.
MAX_REPLICAS = _autoscaling_bound("max_replicas")

# What each checked setting is called on `fleetctl simulate`'s command line.
OPTION_NAMES = {"speedup": "--speedup", "control_interval_seconds": "--control-interval",
                "warmup_seconds": "--warmup-seconds", "deadline_seconds": "--deadline-seconds"}


@dataclass(frozen=True)
class SimulationConfig:
    """Fleet, routing and control-loop settings of one run (times in virtual seconds)."""

    routing: Routing = Routing.PREFIX
    model_id: str = "meta-llama/Llama-3.1-8B"
    gpu_id: str = "H100-SXM-80GB"
    initial_replicas: int = 1
    min_replicas: int = 1
    max_replicas: int = 8
    gpus_per_node: int = 8
    pool_id: str = "sim"
    speedup: float = 1.0  # arrivals come this many times faster than the trace says
    control_interval_seconds: float = 2.0  # completions are reported to admission this often
    autoscale: bool = True
    autoscale_interval_seconds: float = 15.0
    service_tokens_per_second: float | None = None  # autoscaler calibration; None: from costs
    warmup_seconds: float = 60.0  # a new replica loads weights this long before it is ready
    deadline_seconds: float = 60.0  # each request's deadline after its arrival
    max_queued_requests: int = 256
    rollout: bool = True
    rollout_start_fraction: float = 0.1  # of the trace's span
    rollout_interval_seconds: float = 60.0
    canary_min_samples: int = 50
    canary_traffic_percents: tuple[float, ...] = (10.0, 50.0)

    def validate(self) -> SimulationConfig:
        """Refuse settings no run can honour, naming the option (InputError); returns self.

        Checked before the log exists, so a refused run writes nothing."""
        problems = []
        if not 1 <= self.max_replicas <= MAX_REPLICAS:
            problems.append(f"--max-replicas {self.max_replicas}: need 1..{MAX_REPLICAS}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            problems.append(f"--min-replicas {self.min_replicas}: need 1 <= --min-replicas <= "
                            f"--max-replicas ({self.max_replicas})")
        if not 1 <= self.initial_replicas <= self.max_replicas:
            problems.append(f"--replicas {self.initial_replicas}: need 1 <= --replicas <= "
                            f"--max-replicas ({self.max_replicas})")
        for name in ("speedup", "control_interval_seconds", "autoscale_interval_seconds",
                     "warmup_seconds", "deadline_seconds", "rollout_interval_seconds"):
            value = getattr(self, name)
            if not value > 0 or value != value or value == float("inf"):
                problems.append(f"{OPTION_NAMES.get(name, name)} must be a positive finite number")
        if self.service_tokens_per_second is not None and not self.service_tokens_per_second > 0:
            problems.append("the service rate must be positive")
        if not 0 <= self.rollout_start_fraction <= 1:
            problems.append("rollout_start_fraction must be within 0..1")
        if self.max_queued_requests < 0 or self.canary_min_samples < 1:
            problems.append("queue bound must be >= 0 and canary samples >= 1")
        if problems:
            raise InputError("; ".join(problems))
        return self

    def validate_for(self, trace: Trace) -> SimulationConfig:
        """Refuse a speedup that stretches `trace` past the span a trace may have; returns self.

        Arrivals come at trace time / speedup, so a small speedup stretches a valid trace
        beyond the bound `traces` holds every trace to (the virtual clock's range).
        """
        if trace.span_seconds / self.speedup > MAX_SPAN_SECONDS:
            raise InputError(f"--speedup {self.speedup:g}: stretches the trace's "
                             f"{trace.span_seconds:.0f} s to more than {MAX_SPAN_SECONDS:.0f} s "
                             "(ten years) of virtual clock")
        return self
