"""A simulation's settings, model and GPU are refused by the checks that run before its log
exists, naming the option; the replica bound is exactly what the control plane accepts."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.errors import InputError
from controlplane.policy_book import validate_parameters
from controlplane.simulation.config import MAX_REPLICAS, SimulationConfig
from controlplane.simulation.fleet import resolve_catalog


def test_the_replica_bound_is_the_largest_the_autoscaling_policy_accepts() -> None:
    validate_parameters("autoscaling", {"min_replicas": MAX_REPLICAS, "max_replicas": MAX_REPLICAS})
    with pytest.raises(InputError, match="max_replicas"):
        validate_parameters("autoscaling", {"max_replicas": MAX_REPLICAS + 1})


@pytest.mark.parametrize(("named", "settings"), [
    ("--max-replicas", {"max_replicas": MAX_REPLICAS + 1}),
    ("--min-replicas", {"min_replicas": 3, "max_replicas": 2}),
    ("--replicas", {"initial_replicas": 9, "max_replicas": 8}),
    ("--speedup", {"speedup": float("nan")}),
    ("--control-interval", {"control_interval_seconds": float("inf")}),
    ("--deadline-seconds", {"deadline_seconds": 0.0}),
])
def test_a_setting_no_run_can_honour_is_refused_naming_its_option(
        named: str, settings: dict[str, Any]) -> None:
    with pytest.raises(InputError, match=named):
        SimulationConfig(**settings).validate()


def test_a_gpu_the_engines_cannot_be_costed_on_is_refused_with_the_catalog_checks() -> None:
    with pytest.raises(InputError, match="--gpu A10G-24GB"):
        resolve_catalog(SimulationConfig(gpu_id="A10G"))
