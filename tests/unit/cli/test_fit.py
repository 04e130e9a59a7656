"""`fleetctl fit` through click's CliRunner: JSON figures, human table, exit codes, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from controlplane.catalog.registry import load_catalog
from controlplane.cli.fit import fit

COURSE = ["--params", "8e9", "--layers", "32", "--kv-heads", "8", "--head-dim", "128",
          "--weight-dtype", "fp16", "--kv-dtype", "fp16", "--gpu-memory-gib", "24",
          "--max-model-len", "4096", "--concurrency", "8", "--usable-fraction", "1.0",
          "--runtime-overhead-gib", "4"]


def run(*args: str) -> Result:
    return CliRunner().invoke(fit, list(args))


def run_json(*args: str) -> tuple[int, dict[str, Any]]:
    result = run(*args, "--json")
    return result.exit_code, json.loads(result.stdout)


def replaced(args: list[str], flag: str, value: str) -> list[str]:
    updated = list(args)
    updated[updated.index(flag) + 1] = value
    return updated


def test_course_worked_example_comes_out_of_fit_as_json() -> None:
    exit_code, report = run_json(*COURSE)
    assert exit_code == 0 and report["fits"] is True
    assert round(report["weight_gib_per_gpu"], 2) == 14.90
    assert report["kv_bytes_per_token"] == report["kv_bytes_per_token_per_gpu"] == 131_072
    assert report["kv_gib_per_gpu"] == 4.0 and report["usable_gib_per_gpu"] == 24.0
    assert round(report["required_gib_per_gpu"], 2) == 22.90
    assert report["kv_capacity_tokens"] == 41_769 and report["max_concurrency"] == 10
    assert [reason["code"] for reason in report["reasons"]] == ["fits_with_headroom"]
    assert set(report["reasons"][0]) == {"code", "message", "facts"}


@pytest.mark.parametrize(("flag", "value", "exit_code", "required_gib"), [
    ("--max-model-len", "8192", 1, 26.90),
    ("--weight-dtype", "int4", 0, 11.73),
    ("--concurrency", "1", 0, 19.40),
    ("--gpu-memory-gib", "16", 1, 22.90),
])
def test_course_lab_cases_exit_by_whether_they_fit(flag: str, value: str, exit_code: int,
                                                   required_gib: float) -> None:
    code, report = run_json(*replaced(COURSE, flag, value))
    assert code == exit_code and report["fits"] is (exit_code == 0)
    assert round(report["required_gib_per_gpu"], 2) == required_gib


def test_weight_bits_declare_the_four_bit_case_without_a_dtype() -> None:
    args = list(COURSE)
    position = args.index("--weight-dtype")
    args[position:position + 2] = ["--weight-bits", "4"]
    code, report = run_json(*args)
    assert code == 0 and report["weight_dtype"] is None and report["weight_bits"] == 4
    assert round(report["required_gib_per_gpu"], 2) == 11.73


def test_human_output_is_a_table_with_the_figures_and_reason_codes() -> None:
    result = run(*COURSE)
    assert result.exit_code == 0
    assert "22.90" in result.stdout and "14.90" in result.stdout
    assert "fits_with_headroom" in result.stdout
    refused = run(*replaced(COURSE, "--max-model-len", "8192"))
    assert refused.exit_code == 1 and "exceeds_usable_memory" in refused.stdout


def test_catalog_model_on_a_catalog_gpu() -> None:
    code, report = run_json("--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "H100",
                            "--tp", "4", "--max-model-len", "32768", "--concurrency", "16",
                            "--kv-dtype", "fp8")
    assert code == 0 and report["model_id"] == "meta-llama/Llama-3.1-70B"
    assert report["kv_bytes_per_token"] == 163_840
    assert report["kv_bytes_per_token_per_gpu"] == 40_960
    assert report["gpu_memory_gib"] == 79.19


def test_fp8_on_ampere_exits_1_with_the_refusing_reason() -> None:
    code, report = run_json("--model", "deepseek-ai/DeepSeek-V3", "--gpu", "A100-SXM-80GB",
                            "--tp", "8", "--pp", "2", "--max-model-len", "8192")
    assert code == 1
    assert report["reasons"][0]["code"] == "weight_dtype_unsupported_by_gpu"
    assert report["reasons"][0]["facts"]["weight_dtype"] == "fp8"


def test_a_config_json_path_is_accepted_as_the_model(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(load_catalog().model("google/gemma-2-9b").config)),
                    encoding="utf-8")
    code, report = run_json("--model", str(path), "--gpu", "L4", "--kv-window-tokens", "4096",
                            "--weight-dtype", "fp8")
    assert code == 0 and report["model_source"] == "config_file"
    assert report["kv_bytes_per_token"] == 344_064 and report["kv_tokens_per_sequence"] == 6144


def one_error_line(result: Result) -> str:
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


def test_unknown_model_exits_2_with_one_line_listing_close_matches() -> None:
    line = one_error_line(run("--model", "meta-llama/Llama-3.1-9B", "--gpu", "H100"))
    assert "--model" in line and "unknown_model" in line
    assert "meta-llama/Llama-3.1-8B" in line
    assert run("--model", "meta-llama/Llama-3.1-9B", "--gpu", "H100").stdout == ""


@pytest.mark.parametrize(("args", "flag", "code"), [
    (["--model", "meta-llama/Llama-3.1-8B"], "--gpu", "gpu_required"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--gpu-memory-gib", "80"],
     "--gpu-memory-gib", "gpu_source_conflict"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpu-memory-gib", "nan"], "--gpu-memory-gib",
     "deployment_field_not_positive"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--usable-fraction", "inf"],
     "--usable-fraction", "usable_fraction_out_of_range"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpu", "H101"], "--gpu", "unknown_gpu"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--concurrency", "0"],
     "--concurrency", "deployment_field_not_positive"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--weight-dtype", "fp8",
      "--weight-bits", "8"], "--weight-bits", "weight_format_conflict"),
    (["--params", "8e9", "--layers", "32", "--gpu", "H100"], "--kv-heads",
     "architecture_incomplete"),
    (["--model", "mistralai/Mistral-7B-v0.3", "--gpu", "H100", "--kv-window-tokens", "4096"],
     "--kv-window-tokens", "model_has_no_sliding_window"),
    (["--model", "missing.json", "--gpu", "H100"], "--model", "config_unreadable"),
])
def test_bad_input_exits_2_with_one_line_naming_the_flag(args: list[str], flag: str,
                                                         code: str) -> None:
    line = one_error_line(run(*args))
    assert f"{flag}:" in line and f"[{code}]" in line


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--runtime-overhead-gib", "inf", "runtime overhead must be a finite number of GiB"),
    ("--runtime-overhead-gib", "nan", "runtime overhead must be a finite number of GiB"),
    ("--gpu-memory-gib", "inf", "GPU memory must be a positive, finite number of GiB"),
])
def test_a_number_that_is_not_finite_is_refused_as_such_not_as_negative(
        flag: str, value: str, says: str) -> None:
    # An infinite overhead was refused as "may not be negative", an infinite GPU as "must be
    # positive": neither was what was wrong.
    line = one_error_line(run(*replaced(COURSE, flag, value)))
    assert line.startswith(f"error: {flag}: {says} [")


def test_bad_input_with_json_prints_a_machine_readable_error() -> None:
    result = run("--model", "meta-llama/Llama-3.1-9B", "--gpu", "H100", "--json")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert (error["code"], error["field"], error["option"]) == ("unknown_model", "model",
                                                                "--model")


def test_counts_reject_fractions_and_accept_separators() -> None:
    assert run("--params", "8.5", "--layers", "1").exit_code == 2
    code, report = run_json(*replaced(COURSE, "--params", "8_000_000_000"))
    assert code == 0 and report["parameters"] == 8_000_000_000


def test_a_pipelined_sliding_window_model_is_sized_on_its_heaviest_stage() -> None:
    """Gemma-2-9B over two stages: the last holds 11 of the 21 full-context layers, so its KV
    per sequence is more than the model's average (6,144 tokens a layer) says."""
    args = ["--model", "google/gemma-2-9b", "--gpu-memory-gib", "80", "--max-model-len", "8192",
            "--kv-window-tokens", "4096", "--concurrency", "1"]
    _, one_stage = run_json(*args)
    _, two_stages = run_json(*args, "--pp", "2")
    assert (one_stage["kv_tokens_per_sequence"], two_stages["kv_tokens_per_sequence"]) == (
        6144, 6242)
    window = [n for n in two_stages["notes"] if n["code"] == "kv_window_applied"][0]
    assert window["facts"]["kv_tokens_per_sequence"] == 6242


def test_a_catalog_it_cannot_read_is_blamed_on_the_fixtures_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It named the file alone: nothing said FLEET_FIXTURES_DIR pointed there.
    monkeypatch.setenv("FLEET_FIXTURES_DIR", str(tmp_path / "nowhere"))
    result = run("--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100")
    assert result.exit_code == 2
    assert result.stderr.startswith(
        f"error: FLEET_FIXTURES_DIR ({tmp_path / 'nowhere' / 'catalog' / 'models.json'}): ")
    assert result.stderr.rstrip().endswith("[catalog_unreadable]")


@pytest.mark.parametrize("kv_heads", ["48", "5"])
def test_kv_heads_that_do_not_divide_the_models_attention_heads_are_refused(kv_heads: str) -> None:
    # Sized without complaint: a shape no runtime loads.
    result = run("--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--max-model-len", "8192",
                 "--kv-heads", kv_heads)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: --kv-heads: {kv_heads} KV heads must divide the "
                                    "model's 32 attention heads")


def test_kv_heads_that_divide_the_attention_heads_still_size_the_model() -> None:
    exit_code, report = run_json("--model", "meta-llama/Llama-3.1-405B", "--gpu", "H100",
                                 "--tp", "8", "--max-model-len", "8192", "--kv-heads", "16")
    assert exit_code in (0, 1) and report["kv_bytes_per_token"] == 1_032_192
