"""`fleetctl fit`: a thin command over `plan_fit`; exit 0 fits, 1 does not fit, 2 bad input."""

from __future__ import annotations

import json
from typing import Any

import click

from controlplane.catalog.config_values import ConfigValueError
from controlplane.catalog.dtypes import DType
from controlplane.catalog.fit import DEFAULT_USABLE_FRACTION, FitReport, FitRequest, plan_fit
from controlplane.catalog.registry import FIXTURES_ENV
from controlplane.catalog.subject import ArchitectureOverrides
from controlplane.policies.reasons import PolicyInputError, to_plain

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT = 0, 1, 2

# Error fields are the library's names; people typed flags. A value read from a model config
# (`ConfigValueError`) is named by its key and file instead, whatever flag shares its name.
_FLAGS = {
    "model": "--model", "config": "--model", "gpu": "--gpu", "gpu_memory_gib": "--gpu-memory-gib",
    "tensor_parallel_size": "--tp", "pipeline_parallel_size": "--pp", "kv_shards": "--tp",
    "weight_dtype": "--weight-dtype", "weight_bits": "--weight-bits", "kv_dtype": "--kv-dtype",
    "max_model_len_tokens": "--max-model-len", "max_live_tokens_per_request": "--max-model-len",
    "target_concurrency": "--concurrency", "usable_fraction": "--usable-fraction",
    "runtime_overhead_gib": "--runtime-overhead-gib", "kv_window_tokens": "--kv-window-tokens",
    "parameters": "--params", "layers": "--layers", "kv_heads": "--kv-heads",
    "head_dim": "--head-dim",
}


class _Count(click.ParamType[int]):
    """A whole number written plainly, with separators, or in exponent form (8e9, 8_000_000_000)."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).replace("_", "").replace(",", "")
        try:
            number = float(text) if any(c in text.lower() for c in ".e") else int(text)
        except ValueError:
            self.fail(f"{value!r} is not a whole number", param, ctx)
        if isinstance(number, float) and not number.is_integer():
            self.fail(f"{value!r} is not a whole number", param, ctx)
        return int(number)


_COUNT = _Count()
_WEIGHT_DTYPES = click.Choice([d.value for d in DType], case_sensitive=False)
_KV_DTYPES = click.Choice(["auto", "bf16", "fp16", "fp32", "fp8"], case_sensitive=False)


@click.command("fit")
@click.option("--model", help="Catalog id (HF repo id) or a path to a config.json.")
@click.option("--gpu", help="Catalog GPU id or alias, e.g. H100-SXM-80GB.")
@click.option("--gpu-memory-gib", type=float, help="GPU memory in GiB instead of --gpu.")
@click.option("--tp", "tensor_parallel_size", type=int, default=1, show_default=True,
              help="Tensor-parallel GPUs per replica.")
@click.option("--pp", "pipeline_parallel_size", type=int, default=1, show_default=True,
              help="Pipeline stages per replica.")
@click.option("--weight-dtype", type=_WEIGHT_DTYPES,
              help="Weight format (default: the checkpoint's).")
@click.option("--weight-bits", type=int, help="Bits per weight instead of --weight-dtype.")
@click.option("--kv-dtype", type=_KV_DTYPES, default="auto", show_default=True,
              help="KV cache format; auto is the model's compute dtype.")
@click.option("--max-model-len", "max_model_len_tokens", type=_COUNT,
              help="Tokens per sequence (default: the model's max_position_embeddings).")
@click.option("--concurrency", "target_concurrency", type=_COUNT, default=1, show_default=True,
              help="Full-length sequences that must fit at once.")
@click.option("--usable-fraction", type=float, default=DEFAULT_USABLE_FRACTION,
              show_default=True, help="Share of GPU memory the runtime may use.")
@click.option("--runtime-overhead-gib", type=float,
              help="Activations, CUDA graphs and workspace per GPU (default: catalog or 2 GiB).")
@click.option("--kv-window-tokens", type=_COUNT,
              help="Declared effective sliding window: cached tokens per sequence are capped.")
@click.option("--params", "parameters", type=_COUNT, help="Declared parameter count.")
@click.option("--layers", type=_COUNT, help="Declared number of layers.")
@click.option("--kv-heads", type=_COUNT, help="Declared number of KV heads.")
@click.option("--head-dim", type=_COUNT, help="Declared head dimension.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def fit(ctx: click.Context, /, as_json: bool, parameters: int | None, layers: int | None,
        kv_heads: int | None, head_dim: int | None, weight_dtype: str | None, kv_dtype: str,
        **settings: Any) -> None:
    """Check whether a model fits a GPU: weights + KV cache + runtime overhead per GPU.

    Without --model, declare the architecture with --params, --layers, --kv-heads and --head-dim.
    FP8 weights or KV on a GPU without FP8 (Ampere) is a refusal (exit 1), not an input error.
    """
    try:
        report = plan_fit(FitRequest(
            overrides=ArchitectureOverrides(parameters=parameters, layers=layers,
                                            kv_heads=kv_heads, head_dim=head_dim),
            weight_dtype=DType(weight_dtype.lower()) if weight_dtype else None,
            kv_dtype=None if kv_dtype.lower() == "auto" else DType(kv_dtype.lower()),
            **settings,
        ))
    except PolicyInputError as error:
        where, located = _blamed(error)
        if as_json:
            click.echo(json.dumps({"error": {**error.as_dict(), **located}}, indent=2))
        click.echo(f"error: {where}: {error.message} [{error.code}]", err=True)
        ctx.exit(EXIT_BAD_INPUT)
    if as_json:
        click.echo(json.dumps(to_plain(report), indent=2))
    else:
        click.echo(render_report(report))
    ctx.exit(EXIT_FITS if report.fits else EXIT_DOES_NOT_FIT)


def _blamed(error: PolicyInputError) -> tuple[str, dict[str, str]]:
    """What a bad input is named by: a config's key and file, or the flag (`option`)."""
    if isinstance(error, ConfigValueError):
        file = f"{error.config_file}: " if error.config_file else ""
        return f"{file}config key {error.field}", {}
    if error.code == "catalog_unreadable":  # the catalog's files: where FLEET_FIXTURES_DIR points
        return f"{FIXTURES_ENV} ({error.field})", {"variable": FIXTURES_ENV}
    flag = _FLAGS.get(error.field, error.field)
    return flag, {"option": flag}


def render_report(report: FitReport) -> str:
    """A short human table of the fit: inputs as resolved, per-GPU figures, the decision."""
    weight_format = report.weight_dtype.value if report.weight_dtype else "declared bits"
    gpu = report.gpu_id or "declared GPU"
    rows = [
        ("model", f"{report.model_id or 'declared architecture'} ({report.model_source}), "
                  f"{report.parameters:,} parameters ({report.parameter_basis})"),
        ("gpu", f"{gpu}: {report.gpu_memory_gib:.2f} GiB ({report.gpu_memory_basis.value}) "
                f"x {report.usable_fraction:.2f} usable"),
        ("layout", f"TP {report.tensor_parallel_size} x PP {report.pipeline_parallel_size}, "
                   f"KV cache in {report.kv_shards} shard(s)"),
        ("weights", f"{weight_format} ({report.weight_bits} bits): "
                    f"{report.weight_gib_per_gpu:.2f} GiB/GPU"),
        ("KV cache", f"{report.kv_dtype.value}: {report.kv_bytes_per_token:,} B/token "
                     f"({report.kv_bytes_per_token_per_gpu:,.0f} B/token/GPU); "
                     f"{report.kv_tokens_per_sequence:,} tokens x {report.target_concurrency} "
                     f"sequences = {report.kv_gib_per_gpu:.2f} GiB/GPU"),
        ("overhead", f"{report.overhead_gib_per_gpu:.2f} GiB/GPU "
                     f"({report.runtime_overhead_basis})"),
        ("required", f"{report.required_gib_per_gpu:.2f} of {report.usable_gib_per_gpu:.2f} "
                     "GiB/GPU usable"),
        ("KV capacity", f"{report.kv_capacity_tokens:,} tokens; {report.max_concurrency} "
                        f"sequences of {report.max_model_len_tokens:,} tokens"
                        f" ({report.kv_tokens_per_sequence:,} cached each)"),
        ("decision", "FITS" if report.fits else "DOES NOT FIT"),
    ]
    lines = [f"{label:<12} {value}" for label, value in rows]
    lines += [f"  - {reason.code}: {reason.message}" for reason in report.reasons]
    if report.notes:
        lines.append("notes")
        lines += [f"  - {note.code}: {note.message}" for note in report.notes]
    return "\n".join(lines)
