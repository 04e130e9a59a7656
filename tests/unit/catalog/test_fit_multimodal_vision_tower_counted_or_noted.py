"""A nested multimodal config (LLaVA: `text_config` and `vision_config` in one config.json) never
silently drops its vision tower: CLIP under a LLaVA projector is counted into the weights; any
other tower is named in a note as not counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controlplane.catalog.errors import CatalogError
from controlplane.catalog.fit import FitReport, FitRequest, plan_fit
from controlplane.catalog.hf_config import parse_hf_config
from controlplane.catalog.registry import load_catalog
from controlplane.catalog.sizing import count_parameters
from controlplane.policies.memory import GIB

CATALOG = load_catalog()
TEXT = dict(CATALOG.model("meta-llama/Llama-3.1-8B").config)
# llava-hf/llava-1.5-7b-hf's vision_config: CLIP ViT-L/14 at 336 px.
CLIP_L_336 = {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
              "num_hidden_layers": 24, "num_attention_heads": 16, "image_size": 336,
              "patch_size": 14, "projection_dim": 768}
LLAVA = {"model_type": "llava", "text_config": TEXT, "vision_config": CLIP_L_336,
         "projector_hidden_act": "gelu", "vision_feature_layer": -2}
# Published counts: CLIP ViT-L/14-336's vision model and LLaVA-1.5's two-layer projector
# (1024 -> 4096 -> 4096, with biases) into a 4,096-wide text model.
CLIP_L_336_PARAMETERS = 303_507_456
PROJECTOR_PARAMETERS = 20_979_712


def fit(config: dict[str, Any], **changes: Any) -> FitReport:
    return plan_fit(FitRequest(config=config, gpu_memory_gib=80, max_model_len_tokens=4096,
                               **changes), CATALOG)


def note(report: FitReport, code: str) -> Any:
    return next((n for n in report.notes if n.code == code), None)


def test_a_clip_tower_under_a_llava_projector_is_counted_into_the_weights() -> None:
    report = fit(LLAVA)
    vision = CLIP_L_336_PARAMETERS + PROJECTOR_PARAMETERS
    assert report.parameters == 8_030_261_248 + vision
    assert report.weight_gib_per_gpu == (8_030_261_248 + vision) * 2 / GIB
    counted = note(report, "vision_tower_counted")
    assert counted is not None and counted.facts["vision_parameters"] == vision
    assert note(report, "vision_tower_not_counted") is None


def test_the_text_model_alone_is_what_it_was() -> None:
    arch = parse_hf_config(LLAVA)
    assert count_parameters(arch).total == 8_030_261_248 and arch.layers == 32
    assert fit(TEXT).parameters == 8_030_261_248 and note(fit(TEXT), "vision_tower_counted") is None


def test_every_pipeline_stage_holds_the_vision_tower() -> None:
    with_tower = fit(LLAVA, pipeline_parallel_size=4).weight_gib_per_gpu
    text_only = fit(TEXT, pipeline_parallel_size=4).weight_gib_per_gpu
    vision = CLIP_L_336_PARAMETERS + PROJECTOR_PARAMETERS
    assert with_tower - text_only == pytest.approx(vision * 2 / GIB, rel=1e-12)


@pytest.mark.parametrize("config", [
    {**LLAVA, "vision_config": {**CLIP_L_336, "model_type": "siglip_vision_model"}},
    {**LLAVA, "vision_config": {k: v for k, v in CLIP_L_336.items() if k != "image_size"}},
    {**LLAVA, "model_type": "some_vlm"},  # a projector fit does not know
    # Qwen2-VL style: the text model at the top level, a vision tower of another shape beside.
    {**TEXT, "vision_config": {"depth": 32, "embed_dim": 1280, "num_heads": 16}},
], ids=["siglip", "clip-missing-key", "unknown-projector", "qwen2-vl-style"])
def test_a_tower_that_cannot_be_counted_is_named_in_a_note(config: dict[str, Any]) -> None:
    report = fit(config)
    assert report.parameters == 8_030_261_248  # the text model only, and it says so
    assert note(report, "vision_tower_not_counted") is not None
    assert note(report, "vision_tower_counted") is None


def test_a_vision_config_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(CatalogError) as refused:
        parse_hf_config({**LLAVA, "vision_config": [1, 2]})
    assert (refused.value.code, refused.value.field) == ("config_field_invalid", "vision_config")


def test_a_bad_vision_size_is_refused_naming_its_nested_key(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAVA, "vision_config": {**CLIP_L_336, "patch_size": 0}}),
                    encoding="utf-8")
    with pytest.raises(CatalogError) as refused:
        parse_hf_config(path)
    assert refused.value.field == "vision_config.patch_size"
    assert "vision_config.patch_size" in refused.value.message
