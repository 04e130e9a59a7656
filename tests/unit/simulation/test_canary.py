"""Rollout driving: the candidate gets the share the stage decision gave it; settings are checked."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from controlplane.commands.rollout import StartRollout
from controlplane.errors import InputError
from controlplane.simulation.canary import RolloutDriver
from controlplane.simulation.config import SimulationConfig


@pytest.mark.parametrize("percent", [0.0, 10.0, 50.0, 100.0])
def test_the_candidate_receives_its_traffic_share_of_requests(percent: float) -> None:
    driver = RolloutDriver(SimulationConfig(), "model", 0.0)
    driver.candidate_percent = percent
    arms = [driver.arm_for(index) for index in range(20_000)]
    assert arms.count("candidate") / len(arms) == pytest.approx(percent / 100, abs=0.01)
    assert arms == [driver.arm_for(index) for index in range(20_000)]


def test_the_first_rollout_command_declares_its_requirements_before_any_evidence() -> None:
    config = SimulationConfig(canary_min_samples=7, canary_traffic_percents=(5.0, 20.0))
    driver = RolloutDriver(config, "model", 30.0)
    assert not driver.due(29.9) and driver.due(30.0)
    [command] = driver.commands(30.0, datetime(2024, 1, 1, tzinfo=UTC))
    assert isinstance(command, StartRollout) and command.requirements is not None
    assert command.requirements.min_sample_count == 7
    assert command.requirements.canary_traffic_percents == [5.0, 20.0]
    assert driver.next_seconds == 30.0 + config.rollout_interval_seconds


@pytest.mark.parametrize("settings", [
    {"min_replicas": 3, "max_replicas": 2}, {"initial_replicas": 9}, {"speedup": 0.0},
    {"control_interval_seconds": float("nan")}, {"rollout_start_fraction": 1.5},
])
def test_settings_no_run_can_honour_are_refused(settings: dict[str, float]) -> None:
    with pytest.raises(InputError):
        SimulationConfig(**settings).validate()  # type: ignore[arg-type]
