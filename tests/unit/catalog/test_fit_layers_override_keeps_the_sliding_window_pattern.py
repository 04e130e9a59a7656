"""`--layers` on a model with sliding windows keeps the family's pattern of windowed layers.

Gemma-2 alternates: even-indexed layers slide (transformers' Gemma2DecoderLayer,
`is_sliding = not bool(layer_idx % 2)`), so ceil(layers / 2) of any count do, as the catalog's 42
layers give 21. A lowered count had made every layer windowed.
"""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.catalog.fit import FitRequest, plan_fit
from controlplane.catalog.hf_config import parse_hf_config
from controlplane.catalog.registry import load_catalog
from controlplane.catalog.subject import ArchitectureOverrides

CATALOG = load_catalog()


def window_note(model: str, layers: int) -> dict[str, Any]:
    report = plan_fit(FitRequest(model=model, gpu_memory_gib=80,
                                 overrides=ArchitectureOverrides(layers=layers),
                                 max_model_len_tokens=8192, kv_window_tokens=4096), CATALOG)
    note = next(n for n in report.notes if n.code == "kv_window_applied")
    return {**note.facts, "tokens": report.kv_tokens_per_sequence}


@pytest.mark.parametrize(("layers", "windowed"), [(42, 21), (10, 5), (5, 3), (1, 1), (60, 30)])
def test_gemma_2_with_other_layer_counts_windows_every_other_layer(layers: int,
                                                                   windowed: int) -> None:
    facts = window_note("google/gemma-2-9b", layers)
    assert (facts["layers"], facts["windowed_layers"]) == (layers, windowed)
    # Half the layers (rounded up) cap at 4,096 tokens, the others keep all 8,192.
    assert facts["tokens"] == -(-((layers - windowed) * 8192 + windowed * 4096) // layers)


def test_a_model_windowed_on_every_layer_stays_so_at_any_count() -> None:
    assert window_note("microsoft/Phi-3-mini-4k-instruct", 8)["windowed_layers"] == 8


def test_qwen2_keeps_its_first_windowed_layer_where_the_config_put_it() -> None:
    config = {**CATALOG.model("Qwen/Qwen2.5-7B").config, "use_sliding_window": True,
              "sliding_window": 4096, "max_window_layers": 20}
    arch = parse_hf_config(config)
    assert arch.sliding_window_layers == 8  # layers 20..27 of 28
    assert [arch.with_layers(n).sliding_window_layers for n in (30, 21, 20, 4)] == [10, 1, 0, 0]


def test_a_model_without_a_window_has_none_at_any_count() -> None:
    arch = CATALOG.model("meta-llama/Llama-3.1-8B").architecture.with_layers(7)
    assert (arch.layers, arch.sliding_window_layers) == (7, 0)
