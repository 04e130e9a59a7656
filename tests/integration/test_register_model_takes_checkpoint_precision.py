"""RegisterModel by catalog id with no weight_bits takes the checkpoint's precision, as `fleetctl
fit` does (DeepSeek-V3 ships FP8: 8 bits, where the command's default had made it 16 and its
placement refused); an explicit weight_bits still wins; commands recorded under the old default
carry weight_bits 16 in their payload and re-derive unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane import handlers
from controlplane.catalog.fit import FitRequest, plan_fit
from controlplane.handlers.fleet import RULES_VERSIONS
from controlplane.replay.verify import verify_decisions
from events.store import EventStore
from tests.factories import place_replica, register_model, register_node
from tests.fleet_helpers import decision, run

pytestmark = pytest.mark.usefixtures("embedded_queue")

DEEPSEEK = "deepseek-ai/DeepSeek-V3"
H200_GIB = 140.4013671875  # fixtures/catalog/gpus.json, H200-SXM-141GB


def h200_node() -> dict[str, Any]:
    return register_node("n1", gpus=8, memory_gib=H200_GIB)


def registered_bits(store: EventStore, model_id: str) -> int:
    bits: int = decision(store, f"model-{model_id}").data["result"]["memory"]["weight_bits"]
    return bits


def test_deepseek_v3_registered_by_catalog_id_is_fp8_as_fit_says(store: EventStore) -> None:
    fit_bits = plan_fit(FitRequest(model=DEEPSEEK, gpu="H200", tensor_parallel_size=8,
                                   max_model_len_tokens=4096)).weight_bits
    run(store, h200_node(), register_model("ds", DEEPSEEK),
        place_replica("r1", model_id="ds", tp=8))
    assert registered_bits(store, "ds") == fit_bits == 8
    registered = decision(store, "model-ds")
    assert registered.data["rules_version"] == RULES_VERSIONS["RegisterModel"]
    assert decision(store, "place-r1").event_type == "ReplicaPlaced"


def test_an_explicit_weight_bits_still_wins(store: EventStore) -> None:
    run(store, h200_node(), {**register_model("ds16", DEEPSEEK), "weight_bits": 16},
        place_replica("r1", model_id="ds16", tp=8))
    assert registered_bits(store, "ds16") == 16
    assert decision(store, "place-r1").event_type == "PlacementRefused"  # 156 GiB per GPU


def test_a_bf16_catalog_model_stays_16_bits(store: EventStore) -> None:
    run(store, register_model("llama"))
    assert registered_bits(store, "llama") == 16


def test_a_registration_recorded_under_the_old_default_re_derives_unchanged(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a version-1 log holds it: the payload dumped the default, `weight_bits: 16`."""
    with monkeypatch.context() as old_rules:
        old_rules.setitem(handlers.RULES_VERSIONS, "RegisterModel", 1)
        run(store, {**register_model("ds", DEEPSEEK), "weight_bits": 16})
    recorded = decision(store, "model-ds")
    assert (recorded.data["rules_version"], registered_bits(store, "ds")) == (1, 16)
    report = verify_decisions(store)
    assert report.decisions_checked == 1 and report.drifts == []
