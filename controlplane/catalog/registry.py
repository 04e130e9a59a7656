"""The model and GPU catalog read from `fixtures/catalog/`, with forgiving id resolution."""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from controlplane.catalog.architecture import Architecture
from controlplane.catalog.errors import CatalogError, UnknownCatalogIdError
from controlplane.catalog.gpus import GpuType, parse_gpu
from controlplane.catalog.hf_config import parse_hf_config
from controlplane.catalog.sizing import ParameterCount

FIXTURES_ENV = "FLEET_FIXTURES_DIR"
# Fine-tuned checkpoints share their base model's architecture.
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-it")


@dataclass(frozen=True)
class CatalogModel:
    """One catalog model: its architecture plus the sourced counts kept beside it as data."""

    model_id: str
    architecture: Architecture
    config: Mapping[str, Any]
    parameters: ParameterCount
    parameters_reported: str
    bf16_weight_bytes: int
    kv_bytes_per_token_bf16: int
    activation_reserve_gib: float | None
    attribution: str
    architecture_of: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Catalog:
    models: Mapping[str, CatalogModel]
    gpus: Mapping[str, GpuType]

    def model(self, requested: str) -> CatalogModel:
        """The model named by an HF repo id (any case; -Instruct/-it/-Chat map to the base)."""
        return self.models[_resolve(requested, self.models, _model_candidates, "model")]

    def gpu(self, requested: str) -> GpuType:
        """The GPU named by its id or an alias (any case; spaces and underscores as hyphens)."""
        return self.gpus[_resolve(requested, self.gpus,
                                  lambda key: (key, *self.gpus[key].aliases), "gpu")]


def fixtures_dir() -> Path:
    """`$FLEET_FIXTURES_DIR` when set, else the repository's `fixtures/` directory."""
    configured = os.environ.get(FIXTURES_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / "fixtures"


def load_catalog(directory: Path | None = None) -> Catalog:
    """Read and validate `catalog/models.json` and `catalog/gpus.json` (cached per directory)."""
    return _load_catalog((directory or fixtures_dir()).resolve())


@lru_cache(maxsize=8)
def _load_catalog(directory: Path) -> Catalog:
    model_entries = _read_section(directory / "catalog" / "models.json", "models")
    gpu_entries = _read_section(directory / "catalog" / "gpus.json", "gpus")
    models = {model_id: _parse_model(model_id, entry, model_entries)
              for model_id, entry in model_entries.items()}
    gpus = {gpu_id: parse_gpu(gpu_id, entry) for gpu_id, entry in gpu_entries.items()}
    return Catalog(models=models, gpus=gpus)


def _read_section(path: Path, section: str) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CatalogError("catalog_unreadable", str(path),
                           f"cannot read catalog file {str(path)!r}: {error}") from None
    entries = document.get(section) if isinstance(document, dict) else None
    if not isinstance(entries, dict):
        raise CatalogError("catalog_unreadable", str(path),
                           f"{path.name} has no {section!r} object")
    return entries


def _parse_model(model_id: str, entry: Mapping[str, Any],
                 entries: Mapping[str, Any]) -> CatalogModel:
    base_id = entry.get("architecture_of")
    base = entries.get(base_id) if base_id else entry
    if not isinstance(base, Mapping) or "config" not in base:
        raise CatalogError("catalog_entry_invalid", model_id,
                           f"{model_id}: architecture_of names no entry with a config")
    config = {**base["config"], **entry.get("config_overrides", {})}
    try:
        counts = base["parameters"]
        return CatalogModel(
            model_id=model_id,
            architecture=parse_hf_config(config),
            config=config,
            parameters=ParameterCount(total=int(counts["total"]),
                                      active=int(counts.get("active", counts["total"]))),
            parameters_reported=str(counts["reported"]),
            bf16_weight_bytes=int(base["bf16_weight_bytes"]),
            kv_bytes_per_token_bf16=int(base["kv_bytes_per_token_bf16"]),
            activation_reserve_gib=_reserve(base),
            attribution=str(entry["attribution"]),
            architecture_of=base_id,
            notes=tuple(str(note) for note in (*entry.get("notes", ()),
                                               *(base.get("notes", ()) if base_id else ()))),
        )
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, CatalogError):
            raise CatalogError(error.code, f"{model_id}.{error.field}", error.message) from None
        raise CatalogError("catalog_entry_invalid", model_id,
                           f"model catalog entry {model_id!r} is malformed: {error!r}") from None


def _reserve(entry: Mapping[str, Any]) -> float | None:
    observed = entry.get("observed_activation_reserve_gib")
    return None if observed is None else float(observed["value"])


def _strip_variant(name: str) -> str:
    for suffix in _VARIANT_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _model_candidates(key: str) -> tuple[str, ...]:
    return (key, key.rsplit("/", 1)[-1])


def _normalise(name: str) -> str:
    return name.strip().lower().replace(" ", "-").replace("_", "-")


def _resolve(requested: str, keys: Iterable[str],
             candidates: Callable[[str], tuple[str, ...]], kind: str) -> str:
    wanted = _normalise(requested)
    names: dict[str, set[str]] = {}
    for key in keys:
        for name in candidates(key):
            names.setdefault(_normalise(name), set()).add(key)
    matched = names.get(wanted, set())
    if not matched:
        # A fine-tuned variant resolves to its base; a base-only request finds an instruct-only
        # entry (Llama-3.3-70B); when both exist, the base wins.
        stripped = _strip_variant(wanted)
        matched = {key for name, owners in names.items() if _strip_variant(name) == stripped
                   for key in owners}
        bases = {key for key in matched if _strip_variant(_normalise(key)) == _normalise(key)}
        matched = bases or matched
    if len(matched) == 1:
        return next(iter(matched))
    if matched:
        raise CatalogError(f"ambiguous_{kind}", kind,
                           f"{requested!r} matches several {kind}s: {', '.join(sorted(matched))}")
    close = difflib.get_close_matches(wanted, sorted(names), n=3, cutoff=0.5)
    suggestions = tuple(dict.fromkeys(sorted(names[name])[0] for name in close))
    raise UnknownCatalogIdError(kind, requested, suggestions)
