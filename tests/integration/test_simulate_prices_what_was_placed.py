"""A simulated replica's step costs are priced from what its placement put on each GPU: the
weights at the precision the model was registered at and the KV bytes per token per GPU the
memory fit sized, so the simulated latencies describe the replica the control plane placed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controlplane.catalog.registry import load_catalog
from controlplane.runtime import open_store
from controlplane.simulation.config import SimulationConfig
from controlplane.simulation.control import ControlPlane
from controlplane.simulation.costs import (
    HBM_EFFICIENCY,
    STEP_OVERHEAD_SECONDS,
    service_tokens_per_second,
)
from controlplane.simulation.fleet import Fleet, build_fleet
from controlplane.simulation.traces import Trace, read_trace
from events.store import EventStore

AZURE_CONV = Path(__file__).resolve().parents[2] / "fixtures" / "traces" / \
    "AzureLLMInferenceTrace_conv.csv"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    opened = open_store(f"sqlite:///{tmp_path}/sim.db")
    yield opened
    opened.engine.dispose()


def _fleet(store: EventStore, model_id: str, gpu_id: str) -> tuple[Fleet, Trace, ControlPlane]:
    trace = read_trace(AZURE_CONV, 20)
    control = ControlPlane(store)
    config = SimulationConfig(model_id=model_id, gpu_id=gpu_id, autoscale=False, rollout=False)
    fleet = build_fleet(control, config.validate(), trace,
                        lambda seconds: datetime.fromtimestamp(seconds, UTC))
    return fleet, trace, control


def _bandwidth_bytes_per_second(gpu_id: str) -> float:
    return load_catalog().gpu(gpu_id).memory_bandwidth_gb_per_second * 1e9 * HBM_EFFICIENCY


def test_an_fp8_checkpoint_decodes_reading_its_fp8_weights_and_its_whole_latent_kv_per_gpu(
        store: EventStore) -> None:
    fleet, trace, control = _fleet(store, "deepseek-ai/DeepSeek-V3", "H200")
    model = fleet.model
    registered = next(e for e in control.store.read_all() if e.event_type == "ModelRegistered")
    assert registered.data["result"]["memory"]["weight_bits"] == 8
    (replica,) = fleet.replicas.values()
    assert replica.tensor_parallel == 8
    bandwidth = _bandwidth_bytes_per_second("H200")
    costs = replica.engine.costs
    # 1,342,052,808,704 parameters at one byte each over 8 GPUs: 167.8 GB per GPU, not 335.5.
    assert costs.step_base_seconds == pytest.approx(
        STEP_OVERHEAD_SECONDS + model.parameters.total / 8 / bandwidth)
    # Every GPU holds the whole latent KV (70,272 B/token): TP does not split it.
    assert costs.kv_read_seconds_per_token == pytest.approx(70_272 / bandwidth)
    # The autoscaler's service rate is calibrated on those same costs.
    assert fleet.service_tokens_per_second == round(service_tokens_per_second(
        costs, trace.prompt_tokens / len(trace.requests),
        trace.output_tokens / len(trace.requests)), 1)


def test_a_bf16_model_decodes_reading_its_bf16_weights_and_its_share_of_the_kv(
        store: EventStore) -> None:
    fleet, _, _ = _fleet(store, "meta-llama/Llama-3.1-70B", "H100")
    (replica,) = fleet.replicas.values()
    tp = replica.tensor_parallel
    assert tp > 1
    bandwidth = _bandwidth_bytes_per_second("H100")
    costs = replica.engine.costs
    assert costs.step_base_seconds == pytest.approx(
        STEP_OVERHEAD_SECONDS + fleet.model.bf16_weight_bytes / tp / bandwidth, rel=1e-12)
    assert costs.kv_read_seconds_per_token == pytest.approx(
        fleet.model.kv_bytes_per_token_bf16 / tp / bandwidth, rel=1e-12)
