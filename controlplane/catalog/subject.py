"""The model a fit is about: a catalog id, a config file, or an architecture declared in flags."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from controlplane.catalog.architecture import Architecture, parse_hf_config
from controlplane.catalog.dtypes import DType
from controlplane.catalog.registry import Catalog
from controlplane.catalog.sizing import count_parameters
from controlplane.policies.reasons import PolicyInputError, require

_DECLARABLE = ("parameters", "layers", "kv_heads", "head_dim")


@dataclass(frozen=True)
class ArchitectureOverrides:
    """Architecture fields declared by the operator; they replace the model's own values."""

    parameters: int | None = None
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None


@dataclass(frozen=True)
class FitSubject:
    """The resolved model: `architecture` is None for an architecture declared only in flags."""

    model_id: str | None
    source: str  # catalog | config_file | config | declared
    architecture: Architecture | None
    parameters: int
    parameter_basis: str  # catalog | declared | formula | formula_unverified_family
    layers: int
    kv_heads: int
    head_dim: int
    kv_latent_dim: int
    activation_reserve_gib: float | None


def looks_like_config_path(value: str) -> bool:
    """True when `value` names a JSON file or a directory holding config.json, not a catalog id."""
    path = Path(value)
    return value.endswith(".json") or path.is_file() or (path / "config.json").is_file()


def resolve_subject(model: str | None, config: Mapping[str, Any] | None,
                    overrides: ArchitectureOverrides,
                    catalog: Callable[[], Catalog]) -> FitSubject:
    """Resolve the model of a fit; `catalog` is called only when a catalog id must be looked up."""
    for name in _DECLARABLE:
        value = getattr(overrides, name)
        require(value is None or (isinstance(value, int) and not isinstance(value, bool)
                                  and value > 0),
                "declared_field_not_positive", name, f"declared {name} must be a positive integer")
    require(model is None or config is None, "model_source_conflict", "model",
            "give a model id/path or a config mapping, not both")
    if model is None and config is None:
        return _declared(overrides)
    entry = None
    if config is not None:
        arch, source, model_id = parse_hf_config(config), "config", None
    elif model is not None and looks_like_config_path(model):
        arch, source, model_id = parse_hf_config(model), "config_file", model
    else:
        entry = catalog().model(str(model))
        arch, source, model_id = entry.architecture, "catalog", entry.model_id
    if arch.latent is not None:
        for name in ("kv_heads", "head_dim"):
            if getattr(overrides, name) is not None:
                raise PolicyInputError("override_not_applicable", name,
                                       f"{name} does not size latent (MLA) KV: not declarable")
    changes = {name: getattr(overrides, name) for name in ("layers", "kv_heads", "head_dim")
               if getattr(overrides, name) is not None}
    if changes:
        arch = replace(arch, **changes)
        arch = replace(arch, sliding_window_layers=min(arch.sliding_window_layers, arch.layers))
    if overrides.parameters is not None:
        parameters, basis = overrides.parameters, "declared"
    elif entry is not None and not changes:
        parameters, basis = entry.parameters.total, "catalog"
    else:
        parameters = count_parameters(arch).total
        basis = "formula" if arch.family_verified else "formula_unverified_family"
    return FitSubject(
        model_id=model_id, source=source, architecture=arch, parameters=parameters,
        parameter_basis=basis, layers=arch.layers, kv_heads=arch.kv_heads, head_dim=arch.head_dim,
        kv_latent_dim=arch.latent.cached_elements_per_layer if arch.latent else 0,
        activation_reserve_gib=entry.activation_reserve_gib if entry is not None else None,
    )


def _declared(overrides: ArchitectureOverrides) -> FitSubject:
    for name in _DECLARABLE:
        require(getattr(overrides, name) is not None, "architecture_incomplete", name,
                f"without a model, declare {name} (and all of: {', '.join(_DECLARABLE)})")
    return FitSubject(
        model_id=None, source="declared", architecture=None,
        parameters=int(overrides.parameters or 0), parameter_basis="declared",
        layers=int(overrides.layers or 0), kv_heads=int(overrides.kv_heads or 0),
        head_dim=int(overrides.head_dim or 0), kv_latent_dim=0, activation_reserve_gib=None,
    )


def default_weight_dtype(subject: FitSubject) -> DType:
    """The format a runtime loads by default: the checkpoint's quantization, else its dtype.

    FP32 checkpoints are served in FP16 (what vLLM's `--dtype auto` does); a model declared only
    in flags, or a config without a dtype, is taken as BF16.
    """
    arch = subject.architecture
    if arch is None:
        return DType.BF16
    if arch.quantization_method is not None and arch.checkpoint_weight_dtype is None:
        raise PolicyInputError("weight_dtype_unknown", "weight_dtype",
                               f"the checkpoint is quantized with {arch.quantization_method!r}; "
                               "declare the weight dtype or bits")
    declared = arch.checkpoint_weight_dtype or DType.BF16
    return DType.FP16 if declared is DType.FP32 else declared


def compute_dtype(subject: FitSubject, weight_dtype: DType | None) -> DType:
    """The dtype activations (and an `auto` KV cache) use: float weights' own, else the model's."""
    if weight_dtype is not None and weight_dtype.is_float_compute:
        return weight_dtype
    arch = subject.architecture
    model_dtype = arch.compute_dtype if arch is not None else None
    if model_dtype is None:
        return DType.BF16
    return DType.FP16 if model_dtype is DType.FP32 else model_dtype
