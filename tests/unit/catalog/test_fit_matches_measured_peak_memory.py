"""The memory calculator against peak memory measured on real hardware (Qwen's published
speed benchmark, A100 80GB, BF16; fixtures/benchmarks/README.md).

At a one-token prompt the measured peak is weights plus the KV cache of the 2,049 tokens the
run held, with next to no activations: the calculator's weights and KV (no runtime overhead)
must come within 1% of it. With long prompts the measured peak adds the prefill's activations,
which the calculator leaves to the declared runtime overhead: its weights and KV stay a lower
bound there.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from controlplane.catalog.fit import FitRequest, plan_fit
from controlplane.catalog.registry import load_catalog

MEASURED = Path(__file__).resolve().parents[3] / "fixtures" / "benchmarks" / \
    "qwen2.5_bf16_peak_memory_a100_80gb.csv"
GENERATED_TOKENS = 2_048  # every run of the benchmark generates this many
CATALOG = load_catalog()


def rows() -> list[dict[str, str]]:
    with MEASURED.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def weights_and_kv_gib(row: dict[str, str]) -> float:
    """Weights and KV cache of the whole model, for the tokens the run held at its peak.

    transformers spreads a model too large for one GPU over `gpu_num` of them layer by layer
    (no tensor parallelism, so no replicated KV heads), and the page sums their peaks: the
    whole model's figures, as on one GPU large enough."""
    report = plan_fit(FitRequest(
        model=f"Qwen/{row['model']}", gpu_memory_gib=1_000.0,
        max_model_len_tokens=int(row["input_length"]) + GENERATED_TOKENS + 1,
        runtime_overhead_gib=0.0), CATALOG)
    return report.weight_gib_per_gpu + report.kv_gib_per_gpu


@pytest.mark.parametrize("row", [r for r in rows() if r["input_length"] == "1"],
                         ids=lambda r: r["model"])
def test_weights_and_kv_match_the_measured_peak_at_a_one_token_prompt(row: dict) -> None:
    measured = float(row["gpu_memory_gb"])
    assert weights_and_kv_gib(row) == pytest.approx(measured, rel=0.01)


@pytest.mark.parametrize("row", rows(), ids=lambda r: f"{r['model']}-{r['input_length']}")
def test_weights_and_kv_never_exceed_the_measured_peak(row: dict) -> None:
    assert weights_and_kv_gib(row) <= float(row["gpu_memory_gb"])
