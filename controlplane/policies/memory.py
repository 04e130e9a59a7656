"""Memory fit: weights plus KV cache plus runtime overhead against usable GPU memory (spec §1.1).

Beyond the spec's per-head KV formula this module also sizes multi-head latent attention (MLA,
DeepSeek), pipeline stages, and a declared effective KV window; every addition defaults to the
spec's behaviour, so the spec's figures come out unchanged.

Pipeline stages: what must fit on a GPU is the largest stage. Layers are split as evenly as
possible, so a stage holds at most ceil(layers / stages) of them; the first stage also holds the
input embeddings and the last the output head (`PipelineSplit`). Which stage takes the extra
layers is the runtime's choice, so a stage's figure is ceil(layers / stages) of the largest
layer plus the larger of the two ends: the largest stage of any even split, and exactly it when
the stages divide the layers. With one stage the weights are the model's whole parameter count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.policies.reasons import PolicyInputError, Reason, require

GIB = 1024**3


@dataclass(frozen=True)
class ModelMemory:
    """The memory-relevant architecture of a model.

    `kv_latent_dim` > 0 selects latent KV (MLA): each layer caches that many elements per token,
    shared by all heads, so `kv_heads` and `head_dim` do not size the cache.
    """

    parameters: int
    weight_bits: int
    layers: int
    kv_heads: int
    head_dim: int
    kv_element_bytes: int = 2
    kv_latent_dim: int = 0


@dataclass(frozen=True)
class DeploymentMemory:
    """How one replica is laid out on its GPUs and what it must hold.

    `kv_window_tokens`, when declared, caps the tokens each request keeps in the KV cache (an
    effective sliding window); `pipeline_parallel_size` splits layers, so weights and KV per GPU
    are those of the largest stage (see the module docstring and `largest_stage_parameters`).
    """

    gpu_memory_gib: float
    tensor_parallel_size: int
    kv_shards: int
    max_live_tokens_per_request: int
    target_concurrency: int
    runtime_overhead_gib: float
    usable_fraction: float = 0.90
    pipeline_parallel_size: int = 1
    kv_window_tokens: int | None = None


@dataclass(frozen=True)
class PipelineSplit:
    """Where a model's parameters sit when pipeline stages split its layers.

    `layer_parameters` is the largest decoder layer's count (a mixture-of-experts layer, not a
    leading dense one); `first_stage_parameters` only the first stage holds (the input
    embeddings), `last_stage_parameters` only the last (the output head, a copy of the input
    embeddings when the two are tied, and the final norm); `every_stage_parameters` every stage
    (a vision encoder the runtime builds on each). Without a split a model's parameters are
    taken as spread evenly over its layers.
    """

    layer_parameters: int
    first_stage_parameters: int = 0
    last_stage_parameters: int = 0
    every_stage_parameters: int = 0


@dataclass(frozen=True)
class MemoryAssessment:
    fits: bool
    weight_gib_per_gpu: float
    kv_gib_per_gpu: float
    overhead_gib_per_gpu: float
    required_gib_per_gpu: float
    usable_gib_per_gpu: float
    max_concurrency: int
    kv_bytes_per_token: int
    reasons: tuple[Reason, ...]
    kv_bytes_per_token_per_gpu: float = 0.0
    kv_tokens_per_request: int = 0
    kv_capacity_tokens: int = 0


def kv_bytes_per_token(model: ModelMemory) -> int:
    """Bytes cached per token across all layers: 2 (K and V) x heads x head_dim, or the latent."""
    return model.layers * _kv_bytes_per_token_per_layer(model)


def _kv_bytes_per_token_per_layer(model: ModelMemory) -> int:
    if model.kv_latent_dim > 0:
        return model.kv_latent_dim * model.kv_element_bytes
    return 2 * model.kv_heads * model.head_dim * model.kv_element_bytes


def head_split_reasons(tensor_parallel: int, kv_heads: int, kv_latent_dim: int = 0,
                       attention_heads: int | None = None) -> tuple[Reason, ...]:
    """Why a runtime cannot split the model's heads over `tensor_parallel` GPUs; empty when it
    can. The attention heads must divide evenly (when known), and the KV heads either divide
    evenly or be replicated whole (`tensor_parallel` a multiple of them); MLA's latent KV is
    never split, so only its attention heads count."""
    reasons = []
    if attention_heads is not None and attention_heads % tensor_parallel:
        reasons.append(Reason(
            "attention_heads_not_divisible_by_tp",
            f"{attention_heads} attention heads do not split over TP {tensor_parallel}",
            {"attention_heads": attention_heads, "tensor_parallel_size": tensor_parallel}))
    if kv_latent_dim == 0 and kv_heads % tensor_parallel and tensor_parallel % kv_heads:
        reasons.append(Reason(
            "kv_heads_incompatible_with_tp",
            f"{kv_heads} KV heads neither split over nor replicate across TP {tensor_parallel}",
            {"kv_heads": kv_heads, "tensor_parallel_size": tensor_parallel}))
    return tuple(reasons)


def kv_shards_under_tensor_parallel(kv_heads: int, tensor_parallel_size: int,
                                    latent: bool = False) -> int:
    """How many ways TP splits the KV cache: gcd(kv_heads, tp), or 1 for latent (MLA) KV.

    When tp <= kv_heads and divides it, each GPU holds kv_heads / tp heads; when tp > kv_heads
    each KV head is replicated so every GPU still holds one, i.e. per-GPU KV heads =
    max(1, kv_heads / tp). The gcd gives exactly that where the runtime accepts the layout and
    errs on the replicated (larger) side where it does not. MLA's latent is never split by TP.
    """
    require(isinstance(kv_heads, int) and kv_heads > 0, "model_field_not_positive", "kv_heads",
            "kv_heads must be a positive integer")
    require(isinstance(tensor_parallel_size, int) and tensor_parallel_size > 0,
            "deployment_field_not_positive", "tensor_parallel_size",
            "tensor_parallel_size must be a positive integer")
    return 1 if latent else math.gcd(kv_heads, tensor_parallel_size)


def effective_window_tokens(layers: int, windowed_layers: int, live_tokens: int,
                            window_tokens: int) -> int:
    """Tokens per request the cache holds averaged over layers, rounded up, when only
    `windowed_layers` of `layers` are capped at `window_tokens` (Gemma-2 slides on every other
    layer); never more than `live_tokens` and never fewer than the window allows."""
    for name, value in (("layers", layers), ("live_tokens", live_tokens),
                        ("window_tokens", window_tokens)):
        require(_is_count(value) and value > 0, "window_field_not_positive", name,
                f"{name} must be a positive integer")
    require(_is_count(windowed_layers) and 0 <= windowed_layers <= layers,
            "windowed_layers_out_of_range", "windowed_layers",
            "windowed_layers must be between 0 and the number of layers")
    capped = min(live_tokens, window_tokens)
    total = (layers - windowed_layers) * live_tokens + windowed_layers * capped
    return -(-total // layers)


def largest_stage_window_tokens(windowed: Sequence[bool], stages: int, live_tokens: int,
                                window_tokens: int) -> int:
    """`effective_window_tokens` of the pipeline stage that caches the most: `windowed` says
    which layers, in order, keep at most `window_tokens`; stages take ceil(layers / stages)
    layers each, in order (as `largest_stage_parameters` splits them), and the tokens are
    averaged over that many layers, rounded up, as the KV per GPU counts them. With one stage,
    `effective_window_tokens`. Averaged over the whole model instead, a stage holding more of
    the full-context layers (Gemma-2's last stage) was undercounted."""
    layers = len(windowed)
    require(_is_count(stages) and 0 < stages <= layers, "pipeline_stages_exceed_layers",
            "pipeline_parallel_size", f"{stages} pipeline stages cannot split {layers} layers")
    effective_window_tokens(layers, sum(windowed), live_tokens, window_tokens)  # validates
    capped = min(live_tokens, window_tokens)
    stage_layers = -(-layers // stages)
    heaviest = max(sum(capped if slides else live_tokens
                       for slides in windowed[start:start + stage_layers])
                   for start in range(0, layers, stage_layers))
    return -(-heaviest // stage_layers)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Beyond any real model or deployment, and small enough that every figure stays a finite float
# (an integer past a float's range had raised OverflowError; a product past it, infinity).
MAX_COUNT = 10**15
MAX_GIB = 1e9


def _within_range(value: object, bound: float) -> bool:
    """False only for a number beyond `bound` (an int of any size compared exactly); anything
    else (not a number, NaN, infinity) is for the checks that name what is wrong with it."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return True
    return (isinstance(value, float) and not math.isfinite(value)) or abs(value) <= bound


def _validate(model: ModelMemory, deployment: DeploymentMemory) -> None:
    # A message is formatted only for the check that fails: every placement assesses memory,
    # and formatting the thirty-odd messages of checks that passed was most of this function.
    for name in ("parameters", "weight_bits", "layers", "kv_heads", "head_dim", "kv_element_bytes",
                 "kv_latent_dim"):
        if not _within_range(getattr(model, name), MAX_COUNT):
            raise PolicyInputError("model_field_out_of_range", name,
                                   f"model {name} must be at most {MAX_COUNT:.0e}")
    for name in ("tensor_parallel_size", "kv_shards", "max_live_tokens_per_request",
                 "target_concurrency", "pipeline_parallel_size", "kv_window_tokens"):
        value = getattr(deployment, name)
        if not (value is None or _within_range(value, MAX_COUNT)):
            raise PolicyInputError("deployment_field_out_of_range", name,
                                   f"deployment {name} must be at most {MAX_COUNT:.0e}")
    for name in ("gpu_memory_gib", "runtime_overhead_gib"):
        if not _within_range(getattr(deployment, name), MAX_GIB):
            raise PolicyInputError("deployment_field_out_of_range", name,
                                   f"deployment {name} must be at most {MAX_GIB:.0e} GiB")
    for name in ("parameters", "weight_bits", "layers", "kv_heads", "head_dim", "kv_element_bytes"):
        value = getattr(model, name)
        if not _is_count(value):
            raise PolicyInputError("model_field_not_integer", name,
                                   f"model {name} must be an integer")
        if not value > 0:
            raise PolicyInputError("model_field_not_positive", name,
                                   f"model {name} must be positive")
    require(_is_count(model.kv_latent_dim) and model.kv_latent_dim >= 0,
            "model_field_negative", "kv_latent_dim", "kv_latent_dim must be a non-negative integer")
    for name in ("gpu_memory_gib", "tensor_parallel_size", "kv_shards",
                 "max_live_tokens_per_request", "target_concurrency"):
        value = getattr(deployment, name)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value) and value > 0):
            raise PolicyInputError("deployment_field_not_positive", name,
                                   f"deployment {name} must be positive"
                                   if not isinstance(value, float) or math.isfinite(value)
                                   else f"deployment {name} must be a finite number")
        if name != "gpu_memory_gib" and not _is_count(value):
            raise PolicyInputError("deployment_field_not_integer", name,
                                   f"deployment {name} must be an integer")
    overhead = deployment.runtime_overhead_gib
    require(math.isfinite(overhead), "runtime_overhead_not_finite", "runtime_overhead_gib",
            "runtime overhead must be a finite number of GiB")
    require(overhead >= 0, "runtime_overhead_negative",
            "runtime_overhead_gib", "runtime overhead may not be negative")
    fraction = deployment.usable_fraction
    require(0 < fraction <= 1, "usable_fraction_out_of_range", "usable_fraction",
            "usable_fraction must be in (0, 1]")
    stages = deployment.pipeline_parallel_size
    require(_is_count(stages) and stages > 0, "deployment_field_not_positive",
            "pipeline_parallel_size", "pipeline_parallel_size must be a positive integer")
    if not stages <= model.layers:
        raise PolicyInputError("pipeline_stages_exceed_layers", "pipeline_parallel_size",
                               f"{stages} pipeline stages cannot split {model.layers} layers")
    window = deployment.kv_window_tokens
    require(window is None or (_is_count(window) and window > 0), "deployment_field_not_positive",
            "kv_window_tokens", "kv_window_tokens must be a positive integer when declared")


def largest_stage_parameters(model: ModelMemory, stages: int,
                             split: PipelineSplit | None = None) -> int | float:
    """Parameters the largest of `stages` pipeline stages holds: the whole count with one stage;
    otherwise ceil(layers / stages) layers plus the larger of the first stage's and the last
    stage's own parameters, and what every stage holds. Without `split`, ceil(layers / stages)
    of `layers` equal shares of the parameters."""
    if stages == 1:
        return model.parameters
    stage_layers = -(-model.layers // stages)
    if split is None:
        return model.parameters * stage_layers / model.layers
    return (split.every_stage_parameters + stage_layers * split.layer_parameters
            + max(split.first_stage_parameters, split.last_stage_parameters))


def _validate_split(split: PipelineSplit | None) -> None:
    if split is None:
        return
    for name in ("layer_parameters", "first_stage_parameters", "last_stage_parameters",
                 "every_stage_parameters"):
        value = getattr(split, name)
        require(_is_count(value) and 0 <= value <= MAX_COUNT, "pipeline_split_invalid", name,
                f"{name} must be an integer from 0 to {MAX_COUNT:.0e}")


def assess_memory(model: ModelMemory, deployment: DeploymentMemory,
                  split: PipelineSplit | None = None) -> MemoryAssessment:
    """Decide whether `target_concurrency` full-length requests fit; fit is inclusive.

    Weights and KV per GPU are those of the largest pipeline stage (`largest_stage_parameters`,
    with `split` saying where the parameters sit when it is known).
    """
    _validate(model, deployment)
    _validate_split(split)
    stages = deployment.pipeline_parallel_size
    weight_gib = (largest_stage_parameters(model, stages, split) * model.weight_bits / 8
                  / deployment.tensor_parallel_size / GIB)
    per_token = kv_bytes_per_token(model)
    # The largest pipeline stage bounds the per-GPU KV; with one stage this is `per_token`.
    stage_layers = -(-model.layers // stages)
    per_token_per_gpu = _kv_bytes_per_token_per_layer(model) * stage_layers / deployment.kv_shards
    cached_tokens = deployment.max_live_tokens_per_request
    if deployment.kv_window_tokens is not None:
        cached_tokens = min(cached_tokens, deployment.kv_window_tokens)
    kv_gib_per_request = per_token_per_gpu / GIB * cached_tokens
    usable_gib = deployment.gpu_memory_gib * deployment.usable_fraction
    fixed_gib = weight_gib + deployment.runtime_overhead_gib
    available_gib = max(0.0, usable_gib - fixed_gib)
    max_concurrency = int(available_gib // kv_gib_per_request)
    capacity_tokens = int(available_gib * GIB // per_token_per_gpu)
    kv_gib = kv_gib_per_request * deployment.target_concurrency
    required_gib = fixed_gib + kv_gib
    fits = required_gib <= usable_gib
    facts = {
        "weight_gib_per_gpu": weight_gib,
        "kv_gib_per_gpu": kv_gib,
        "overhead_gib_per_gpu": deployment.runtime_overhead_gib,
        "required_gib_per_gpu": required_gib,
        "usable_gib_per_gpu": usable_gib,
        "target_concurrency": deployment.target_concurrency,
        "max_concurrency": max_concurrency,
        "kv_capacity_tokens": capacity_tokens,
    }
    reasons: list[Reason] = []
    if fits:
        reasons.append(Reason("fits_with_headroom",
                              f"fits with {usable_gib - required_gib:.2f} GiB headroom per GPU",
                              {**facts, "headroom_gib_per_gpu": usable_gib - required_gib}))
    else:
        reasons.append(Reason("exceeds_usable_memory",
                              f"requires {required_gib - usable_gib:.2f} GiB more per GPU",
                              {**facts, "shortfall_gib_per_gpu": required_gib - usable_gib}))
        if fixed_gib > usable_gib:
            # Distinguishes "the weights alone do not fit" from "the KV for this load does not".
            reasons.append(Reason("no_memory_left_for_kv_cache",
                                  f"weights and overhead alone need {fixed_gib:.2f} of "
                                  f"{usable_gib:.2f} usable GiB per GPU",
                                  {"fixed_gib_per_gpu": fixed_gib,
                                   "usable_gib_per_gpu": usable_gib}))
    return MemoryAssessment(
        fits=fits,
        weight_gib_per_gpu=weight_gib,
        kv_gib_per_gpu=kv_gib,
        overhead_gib_per_gpu=deployment.runtime_overhead_gib,
        required_gib_per_gpu=required_gib,
        usable_gib_per_gpu=usable_gib,
        max_concurrency=max_concurrency,
        kv_bytes_per_token=per_token,
        reasons=tuple(reasons),
        kv_bytes_per_token_per_gpu=per_token_per_gpu,
        kv_tokens_per_request=cached_tokens,
        kv_capacity_tokens=capacity_tokens,
    )
