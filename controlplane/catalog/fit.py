"""`plan_fit`: will this model, in these formats and this layout, fit this GPU? (`fleetctl fit`)"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controlplane.catalog.architecture import windowed_layer_flags
from controlplane.catalog.dtypes import DType, kv_element_bytes
from controlplane.catalog.gpus import GpuType, MemoryBasis
from controlplane.catalog.registry import Catalog, load_catalog
from controlplane.catalog.subject import (
    ArchitectureOverrides,
    FitSubject,
    compute_dtype,
    default_weight_dtype,
    resolve_subject,
)
from controlplane.policies.memory import (
    DeploymentMemory,
    MemoryAssessment,
    ModelMemory,
    assess_memory,
    effective_window_tokens,
    head_split_reasons,
    kv_shards_under_tensor_parallel,
    largest_stage_parameters,
    largest_stage_window_tokens,
)
from controlplane.policies.reasons import PolicyInputError, Reason, require

DEFAULT_USABLE_FRACTION = 0.90  # vLLM's default gpu_memory_utilization, and the spec's
DEFAULT_RUNTIME_OVERHEAD_GIB = 2.0  # a planning assumption (spec example 01), not a measurement


@dataclass(frozen=True)
class FitRequest:
    """What to fit. `model` is a catalog id or a config.json path; `kv_dtype` None means auto."""

    model: str | None = None
    config: Mapping[str, Any] | None = None
    overrides: ArchitectureOverrides = field(default_factory=ArchitectureOverrides)
    gpu: str | None = None
    gpu_memory_gib: float | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    weight_dtype: DType | None = None
    weight_bits: int | None = None
    kv_dtype: DType | None = None
    max_model_len_tokens: int | None = None
    target_concurrency: int = 1
    usable_fraction: float = DEFAULT_USABLE_FRACTION
    runtime_overhead_gib: float | None = None
    kv_window_tokens: int | None = None


@dataclass(frozen=True)
class FitReport:
    """The fit decision, the resolved inputs it used, and the per-GPU memory arithmetic."""

    fits: bool
    model_id: str | None
    model_source: str
    gpu_id: str | None
    parameters: int
    parameter_basis: str
    weight_dtype: DType | None
    weight_bits: int
    kv_dtype: DType
    kv_element_bytes: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    kv_shards: int
    max_model_len_tokens: int
    kv_tokens_per_sequence: int
    target_concurrency: int
    gpu_memory_gib: float
    gpu_memory_basis: MemoryBasis
    usable_fraction: float
    runtime_overhead_basis: str
    weight_gib_per_gpu: float
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: float
    kv_gib_per_gpu: float
    overhead_gib_per_gpu: float
    required_gib_per_gpu: float
    usable_gib_per_gpu: float
    headroom_gib_per_gpu: float
    kv_capacity_tokens: int
    max_concurrency: int
    reasons: tuple[Reason, ...]
    notes: tuple[Reason, ...] = ()


def plan_fit(request: FitRequest, catalog: Catalog | None = None) -> FitReport:
    """Resolve the request and decide the fit; bad input raises PolicyInputError naming the field.

    Every failing gate (dtype support on the GPU, head divisibility under TP, context length,
    memory) is reported, in that order; `fits` holds only when none fails.
    """
    loaded: list[Catalog] = [catalog] if catalog is not None else []

    def get_catalog() -> Catalog:
        if not loaded:
            loaded.append(load_catalog())
        return loaded[0]

    subject = resolve_subject(request.model, request.config, request.overrides, get_catalog)
    weight_dtype, weight_bits = _weight_format(request, subject)
    kv_dtype = request.kv_dtype or compute_dtype(subject, weight_dtype)
    element_bytes = kv_element_bytes(kv_dtype)
    gpu, memory_gib, memory_basis = _gpu_memory(request, get_catalog)
    max_len = _max_model_len(request, subject)
    window_cap, window_note = _window(request, subject, max_len)
    kv_shards = kv_shards_under_tensor_parallel(subject.kv_heads, request.tensor_parallel_size,
                                                latent=subject.kv_latent_dim > 0)
    overhead_gib, overhead_basis = _overhead(request, subject)
    model = ModelMemory(parameters=subject.parameters, weight_bits=weight_bits,
                        layers=subject.layers, kv_heads=subject.kv_heads,
                        head_dim=subject.head_dim, kv_element_bytes=element_bytes,
                        kv_latent_dim=subject.kv_latent_dim)
    memory = assess_memory(
        model,
        DeploymentMemory(gpu_memory_gib=memory_gib,
                         tensor_parallel_size=request.tensor_parallel_size, kv_shards=kv_shards,
                         max_live_tokens_per_request=max_len,
                         target_concurrency=request.target_concurrency,
                         runtime_overhead_gib=overhead_gib, usable_fraction=request.usable_fraction,
                         pipeline_parallel_size=request.pipeline_parallel_size,
                         kv_window_tokens=window_cap),
        subject.split)
    gates = _gates(request, subject, gpu, weight_dtype, kv_dtype, max_len)
    fits = not gates and memory.fits
    reasons = memory.reasons if fits else (*gates, *(() if memory.fits else memory.reasons))
    notes = _notes(request, subject, kv_shards, memory_basis, overhead_basis,
                   (window_note, _stage_note(request, subject, model)))
    return FitReport(
        fits=fits, model_id=subject.model_id, model_source=subject.source,
        gpu_id=gpu.gpu_id if gpu else None, parameters=subject.parameters,
        parameter_basis=subject.parameter_basis, weight_dtype=weight_dtype,
        weight_bits=weight_bits, kv_dtype=kv_dtype, kv_element_bytes=element_bytes,
        tensor_parallel_size=request.tensor_parallel_size,
        pipeline_parallel_size=request.pipeline_parallel_size, kv_shards=kv_shards,
        max_model_len_tokens=max_len, kv_tokens_per_sequence=memory.kv_tokens_per_request,
        target_concurrency=request.target_concurrency, gpu_memory_gib=memory_gib,
        gpu_memory_basis=memory_basis, usable_fraction=request.usable_fraction,
        runtime_overhead_basis=overhead_basis, **_figures(memory), reasons=tuple(reasons),
        notes=notes,
    )


def _figures(memory: MemoryAssessment) -> dict[str, Any]:
    return {
        "weight_gib_per_gpu": memory.weight_gib_per_gpu,
        "kv_bytes_per_token": memory.kv_bytes_per_token,
        "kv_bytes_per_token_per_gpu": memory.kv_bytes_per_token_per_gpu,
        "kv_gib_per_gpu": memory.kv_gib_per_gpu,
        "overhead_gib_per_gpu": memory.overhead_gib_per_gpu,
        "required_gib_per_gpu": memory.required_gib_per_gpu,
        "usable_gib_per_gpu": memory.usable_gib_per_gpu,
        "headroom_gib_per_gpu": memory.usable_gib_per_gpu - memory.required_gib_per_gpu,
        "kv_capacity_tokens": memory.kv_capacity_tokens,
        "max_concurrency": memory.max_concurrency,
    }


def _weight_format(request: FitRequest, subject: FitSubject) -> tuple[DType | None, int]:
    require(request.weight_dtype is None or request.weight_bits is None, "weight_format_conflict",
            "weight_bits", "declare the weight dtype or the weight bits, not both")
    bits = request.weight_bits
    if bits is not None:
        require(isinstance(bits, int) and not isinstance(bits, bool) and 0 < bits <= 32,
                "weight_bits_out_of_range", "weight_bits",
                "weight bits must be an integer in 1..32")
        return None, bits
    dtype = request.weight_dtype or default_weight_dtype(subject)
    return dtype, dtype.bits


def _gpu_memory(request: FitRequest,
                catalog: Callable[[], Catalog]) -> tuple[GpuType | None, float, MemoryBasis]:
    require(request.gpu is None or request.gpu_memory_gib is None, "gpu_source_conflict",
            "gpu_memory_gib", "give a GPU id or a GPU memory size, not both")
    if request.gpu is not None:
        gpu = catalog().gpu(request.gpu)
        return gpu, gpu.memory_gib, gpu.memory_gib_basis
    memory = request.gpu_memory_gib
    require(memory is not None, "gpu_required", "gpu", "name a GPU or give its memory in GiB")
    require(isinstance(memory, (int, float)) and not isinstance(memory, bool)
            and math.isfinite(float(memory or 0)) and float(memory or 0) > 0,
            "deployment_field_not_positive", "gpu_memory_gib",
            "GPU memory must be a positive, finite number of GiB")
    return None, float(memory or 0), MemoryBasis.DECLARED


def _max_model_len(request: FitRequest, subject: FitSubject) -> int:
    declared = request.max_model_len_tokens
    if declared is None and subject.architecture is not None:
        declared = subject.architecture.max_position_embeddings
    if declared is None:
        raise PolicyInputError("max_model_len_required", "max_model_len_tokens",
                               "the model declares no context length; give the max model length")
    require(isinstance(declared, int) and not isinstance(declared, bool) and declared > 0,
            "deployment_field_not_positive", "max_model_len_tokens",
            "the max model length must be a positive integer")
    return declared


def _window(request: FitRequest, subject: FitSubject,
            max_len: int) -> tuple[int | None, Reason | None]:
    window = request.kv_window_tokens
    if window is None:
        return None, None
    require(isinstance(window, int) and not isinstance(window, bool) and window > 0,
            "deployment_field_not_positive", "kv_window_tokens", "the KV window must be positive")
    arch = subject.architecture
    windowed_layers = subject.layers
    flags = (True,) * subject.layers
    if arch is not None:
        model_window = arch.sliding_window_tokens
        require(model_window is not None, "model_has_no_sliding_window", "kv_window_tokens",
                "this model attends over the whole context; a KV window would undercount its cache")
        require(window >= int(model_window or 0), "kv_window_below_model_window",
                "kv_window_tokens",
                f"the model attends over {model_window} tokens; a smaller window drops needed KV")
        windowed_layers = arch.sliding_window_layers
        flags = windowed_layer_flags(arch)
    stages = request.pipeline_parallel_size
    if isinstance(stages, int) and not isinstance(stages, bool) and 1 < stages <= subject.layers:
        cap = largest_stage_window_tokens(flags, stages, max_len, window)
    else:  # one stage (or a count the memory policy refuses, naming it)
        cap = effective_window_tokens(subject.layers, windowed_layers, max_len, window)
    note = Reason("kv_window_applied",
                  f"{windowed_layers} of {subject.layers} layers keep at most {window} tokens",
                  {"declared_window_tokens": window, "windowed_layers": windowed_layers,
                   "layers": subject.layers, "kv_tokens_per_sequence": cap})
    return cap, note


def _overhead(request: FitRequest, subject: FitSubject) -> tuple[float, str]:
    if request.runtime_overhead_gib is not None:
        return request.runtime_overhead_gib, "declared"
    if subject.activation_reserve_gib is not None:
        return subject.activation_reserve_gib, "catalog_observed_activation"
    return DEFAULT_RUNTIME_OVERHEAD_GIB, "default_assumption"


def _gates(request: FitRequest, subject: FitSubject, gpu: GpuType | None,
           weight_dtype: DType | None, kv_dtype: DType, max_len: int) -> list[Reason]:
    gates: list[Reason] = []
    tp = request.tensor_parallel_size
    if gpu is not None:
        supported = sorted(d.value for d in gpu.dtypes)
        for role, dtype in (("weight", weight_dtype), ("kv", kv_dtype)):
            if dtype is not None and not gpu.supports(dtype):
                gates.append(Reason(f"{role}_dtype_unsupported_by_gpu",
                                    f"{gpu.gpu_id} ({gpu.architecture}) lacks {dtype.value}",
                                    {"gpu_id": gpu.gpu_id, f"{role}_dtype": dtype.value,
                                     "gpu_dtypes": supported}))
    arch = subject.architecture
    gates += head_split_reasons(tp, subject.kv_heads, subject.kv_latent_dim,
                                arch.attention_heads if arch is not None else None)
    max_position = arch.max_position_embeddings if arch is not None else None
    if max_position is not None and max_len > max_position:
        gates.append(Reason("context_exceeds_model_maximum",
                            f"max model length {max_len} exceeds the model's {max_position}",
                            {"max_model_len_tokens": max_len,
                             "max_position_embeddings": max_position}))
    return gates


def _stage_note(request: FitRequest, subject: FitSubject, model: ModelMemory) -> Reason | None:
    """With pipeline stages, what the per-GPU weights are: the largest stage's parameters."""
    stages = request.pipeline_parallel_size
    if stages == 1:
        return None
    stage_layers = -(-subject.layers // stages)
    ends = (" plus the embeddings or the output head, the larger" if subject.split is not None
            else ", the parameters spread evenly over the layers")
    parameters = largest_stage_parameters(model, stages, subject.split)
    return Reason("weights_of_largest_stage",
                  f"weights per GPU are the largest of {stages} pipeline stages: "
                  f"{stage_layers} of {subject.layers} layers{ends}",
                  {"pipeline_parallel_size": stages, "layers_per_stage": stage_layers,
                   "stage_parameters": parameters,
                   "average_stage_parameters": subject.parameters / stages})


def _vision_note(subject: FitSubject) -> Reason | None:
    """Whether a multimodal config's vision tower is in the weights (a declared count is the
    operator's, with or without it)."""
    vision = subject.architecture.vision if subject.architecture is not None else None
    if vision is None or subject.parameter_basis == "declared":
        return None
    if vision.parameters is None:
        return Reason("vision_tower_not_counted",
                      f"the config's vision tower ({vision.model_type}) is not in the weights: "
                      "it cannot be counted from the config; declare the parameter count",
                      {"vision_model_type": vision.model_type})
    return Reason("vision_tower_counted",
                  f"the weights include the vision tower ({vision.model_type}) and its "
                  f"projector, {vision.parameters:,} parameters, on every pipeline stage",
                  {"vision_model_type": vision.model_type,
                   "vision_parameters": vision.parameters})


def _notes(request: FitRequest, subject: FitSubject, kv_shards: int, memory_basis: MemoryBasis,
           overhead_basis: str, extra: tuple[Reason | None, ...]) -> tuple[Reason, ...]:
    notes: list[Reason] = []
    tp = request.tensor_parallel_size
    if tp > kv_shards:
        notes.append(Reason("kv_cache_replicated",
                            f"TP {tp} splits the KV cache {kv_shards} way(s); the rest is copies",
                            {"tensor_parallel_size": tp, "kv_shards": kv_shards,
                             "latent_attention": subject.kv_latent_dim > 0,
                             "copies_per_kv_shard": tp // kv_shards}))
    notes += [note for note in (*extra, _vision_note(subject)) if note is not None]
    arch = subject.architecture
    if arch is not None and arch.quantization_method and arch.compute_dtype is not None:
        notes.append(Reason("checkpoint_quantized",
                            f"weights ship as {arch.quantization_method} though the config's "
                            f"dtype is {arch.compute_dtype.value}",
                            {"quantization_method": arch.quantization_method,
                             "config_dtype": arch.compute_dtype.value}))
    if subject.parameter_basis == "formula_unverified_family":
        notes.append(Reason("parameter_count_estimated",
                            "parameters counted with a dense-decoder formula not checked for "
                            f"{arch.model_type if arch else 'this model'}; declare the count",
                            {"parameters": subject.parameters}))
    if memory_basis is MemoryBasis.NOMINAL_GB_CONVERTED:
        notes.append(Reason("gpu_memory_nominal",
                            "GPU memory is the vendor's GB in GiB, not what the runtime reports",
                            {"memory_basis": memory_basis.value}))
    if overhead_basis == "default_assumption":
        notes.append(Reason("runtime_overhead_assumed",
                            f"runtime overhead is an assumed {DEFAULT_RUNTIME_OVERHEAD_GIB} GiB",
                            {"runtime_overhead_gib": DEFAULT_RUNTIME_OVERHEAD_GIB}))
    return tuple(notes)
