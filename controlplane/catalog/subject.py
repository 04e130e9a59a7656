"""The model a fit is about: a catalog id, a config file, or an architecture declared in flags."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from controlplane.catalog.architecture import Architecture
from controlplane.catalog.config_file import config_path
from controlplane.catalog.config_values import ConfigValueError
from controlplane.catalog.dtypes import DType
from controlplane.catalog.hf_config import parse_hf_config
from controlplane.catalog.registry import Catalog
from controlplane.catalog.sizing import count_parameters
from controlplane.policies.memory import MAX_COUNT, PipelineSplit
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
    """The resolved model: `architecture` is None for an architecture declared only in flags.

    `parameters` includes a counted vision tower; `split` says where the parameters sit across
    pipeline stages (None when the count is declared: it is then spread evenly over the layers).
    """

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
    split: PipelineSplit | None = None


# How a path is written, as opposed to a catalog id (`owner/name`).
_PATH_PREFIXES = ("./", "../", "/", "~")


def looks_like_config_path(value: str) -> bool:
    """True when `value` names a JSON file or a directory (with or without a config.json; one
    without is refused as such, not looked up as a catalog id), or is written as a path."""
    path = Path(value)
    return (value.endswith(".json") or value.startswith(_PATH_PREFIXES) or path.is_file()
            or path.is_dir())


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
    changes = {name: getattr(overrides, name) for name in ("kv_heads", "head_dim")
               if getattr(overrides, name) is not None}
    kv_heads = changes.get("kv_heads")
    if kv_heads is not None and arch.attention_heads % kv_heads:
        raise PolicyInputError(
            "override_not_applicable", "kv_heads",
            f"{kv_heads} KV heads must divide the model's {arch.attention_heads} attention "
            "heads: each KV head serves an equal group of query heads")
    if changes:
        arch = replace(arch, **changes)
    if overrides.layers is not None:
        changes["layers"] = overrides.layers
        arch = arch.with_layers(overrides.layers)
    split = None
    if overrides.parameters is not None:
        parameters, basis = overrides.parameters, "declared"
    else:
        split = pipeline_split(arch)
        if entry is not None and not changes:
            parameters, basis = entry.parameters.total, "catalog"
        else:  # a counted vision tower is part of the model's weights
            parameters = count_parameters(arch).total + split.every_stage_parameters
            basis = "formula" if arch.family_verified else "formula_unverified_family"
        _check_counted(parameters, changes,
                       str(config_path(model)) if model and source == "config_file" else None)
    return FitSubject(
        model_id=model_id, source=source, architecture=arch, parameters=parameters,
        parameter_basis=basis, layers=arch.layers, kv_heads=arch.kv_heads, head_dim=arch.head_dim,
        kv_latent_dim=arch.latent.cached_elements_per_layer if arch.latent else 0,
        activation_reserve_gib=entry.activation_reserve_gib if entry is not None else None,
        split=split,
    )


def _check_counted(parameters: int, changes: Mapping[str, int], config_file: str | None) -> None:
    """A counted model beyond any real one names what made it so: a declared size's flag, else
    the config (a catalog's sizes are real)."""
    if parameters <= MAX_COUNT:
        return
    message = f"the model counts {parameters:.3e} parameters, more than {MAX_COUNT:.0e}"
    if changes:
        name = "layers" if "layers" in changes else next(iter(changes))
        raise PolicyInputError("model_field_out_of_range", name,
                               f"{message} with the declared {name}")
    raise ConfigValueError("config_parameters_out_of_range", "parameters",
                           f"{message}: check hidden_size, intermediate_size, vocab_size and "
                           "num_hidden_layers", config_file)


def pipeline_split(arch: Architecture) -> PipelineSplit:
    """Where `arch`'s parameters sit across pipeline stages (research-data §1.3 formulas).

    The first stage holds the input embeddings; the last the output head (for tied embeddings
    a copy of them: vLLM builds `embed_tokens` on the last rank too) and the final norm; every
    stage the vision tower (vLLM builds it unconditionally). A layer is the largest kind the
    model has: one more layer's worth of `count_parameters`, as a mixture-of-experts layer and,
    when leading layers keep a dense FFN (DeepSeek), as a dense one.
    """
    embeddings = arch.vocab_size * arch.hidden_size

    def one_more_layer(of: Architecture) -> int:
        return (count_parameters(replace(of, layers=of.layers + 1)).total
                - count_parameters(of).total)

    layer = one_more_layer(arch)
    if arch.experts is not None and arch.experts.dense_layers:
        layer = max(layer, one_more_layer(replace(arch, experts=None)))
    vision = arch.vision.parameters if arch.vision is not None else None
    return PipelineSplit(layer_parameters=layer, first_stage_parameters=embeddings,
                         last_stage_parameters=embeddings + arch.hidden_size,
                         every_stage_parameters=vision or 0)


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
    """The format a runtime loads the subject's weights in by default (`serving_weight_dtype`)."""
    return serving_weight_dtype(subject.architecture)


def serving_weight_dtype(arch: Architecture | None) -> DType:
    """The format a runtime loads by default: the checkpoint's quantization, else its dtype.

    FP32 checkpoints are served in FP16 (what vLLM's `--dtype auto` does); a model declared only
    in flags, or a config without a dtype, is taken as BF16. A checkpoint quantized to a format
    the config does not tell raises `weight_dtype_unknown`.
    """
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
