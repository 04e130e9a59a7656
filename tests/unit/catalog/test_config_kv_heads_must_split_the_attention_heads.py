"""A config whose KV heads are more than its attention heads, or do not divide them, describes
no model a runtime loads (each KV head serves an equal group of query heads): it is refused
naming `num_key_value_heads`, never sized."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controlplane.catalog.config_values import ConfigValueError
from controlplane.catalog.errors import CatalogError
from controlplane.catalog.hf_config import parse_hf_config
from controlplane.catalog.registry import fixtures_dir, load_catalog
from tests.unit.catalog.test_catalog_architecture import LLAMA_8B


@pytest.mark.parametrize("kv_heads", [48, 64, 12, 5])  # 32 attention heads
def test_kv_heads_that_do_not_split_the_attention_heads_are_refused_naming_the_key(
        kv_heads: int) -> None:
    with pytest.raises(CatalogError) as refused:
        parse_hf_config({**LLAMA_8B, "num_key_value_heads": kv_heads})
    assert (refused.value.code, refused.value.field) == ("config_field_invalid",
                                                         "num_key_value_heads")


def test_a_config_file_with_impossible_kv_heads_is_refused_naming_the_file(
        tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_8B, "num_key_value_heads": 48}), encoding="utf-8")
    with pytest.raises(ConfigValueError) as refused:
        parse_hf_config(path)
    assert (refused.value.field, refused.value.config_file) == ("num_key_value_heads", str(path))


@pytest.mark.parametrize("kv_heads", [1, 2, 8, 32, None])
def test_kv_heads_that_split_the_attention_heads_are_read(kv_heads: int | None) -> None:
    config: dict[str, Any] = {**LLAMA_8B, "num_key_value_heads": kv_heads}
    assert parse_hf_config(config).kv_heads == (kv_heads or 32)


def test_every_catalog_model_and_fixture_config_still_loads() -> None:
    catalog = load_catalog()
    assert all(model.architecture.attention_heads % model.architecture.kv_heads == 0
               for model in catalog.models.values())
    configs = sorted((fixtures_dir() / "catalog" / "configs").glob("*.json"))
    assert configs and all(parse_hf_config(path).layers > 0 for path in configs)
