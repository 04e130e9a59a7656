"""`fleetctl fit`: an error from a config.json value names the config key and the file, never a
flag that happens to share its name; a flag's error names the flag; exit 2, one line, nothing on
stdout. A quantization_config that is not an object is refused, not ignored; a directory with no
config.json says so instead of being looked up as a catalog id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from controlplane.catalog.registry import load_catalog
from controlplane.cli.fit import fit

LLAMA_8B = dict(load_catalog().model("meta-llama/Llama-3.1-8B").config)


def run(*args: str) -> Result:
    return CliRunner().invoke(fit, list(args))


def error_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    return line


def config_file(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_8B, **changes}), encoding="utf-8")
    return path


@pytest.mark.parametrize(("changes", "key", "code"), [
    ({"head_dim": 0}, "head_dim", "config_field_invalid"),  # --head-dim shares the name
    ({"num_key_value_heads": -8}, "num_key_value_heads", "config_field_invalid"),
    ({"num_key_value_heads": 48}, "num_key_value_heads", "config_field_invalid"),  # > 32 heads
    ({"max_position_embeddings": 10**16}, "max_position_embeddings", "config_field_out_of_range"),
    ({"num_hidden_layers": 10**16}, "num_hidden_layers", "config_field_out_of_range"),
    ({"torch_dtype": "float9"}, "torch_dtype", "dtype_unknown"),
    ({"quantization_config": "fp8"}, "quantization_config", "config_field_invalid"),
    ({"quantization_config": ["fp8"]}, "quantization_config", "config_field_invalid"),
    ({"quantization_config": {"quant_method": 8}}, "quantization_config.quant_method",
     "config_field_invalid"),
    ({"hidden_size": 10**9}, "parameters", "config_parameters_out_of_range"),
])
def test_a_bad_config_value_names_its_key_and_file_not_a_flag(
        tmp_path: Path, changes: dict[str, Any], key: str, code: str) -> None:
    path = config_file(tmp_path, **changes)
    line = error_line(run("--model", str(path), "--gpu", "H100"))
    assert line.startswith(f"error: {path}: config key {key}: ") and line.endswith(f"[{code}]")
    assert "--" not in line.split(": config key")[0]


def test_a_directory_s_config_error_names_the_config_json_inside_it(tmp_path: Path) -> None:
    path = config_file(tmp_path, head_dim=0)
    line = error_line(run("--model", str(tmp_path), "--gpu", "H100"))
    assert line.startswith(f"error: {path}: config key head_dim: ")


def test_the_json_error_carries_the_key_and_file_and_no_option(tmp_path: Path) -> None:
    path = config_file(tmp_path, head_dim=0)
    result = run("--model", str(path), "--gpu", "H100", "--json")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert (error["code"], error["config_key"], error["config_file"]) == (
        "config_field_invalid", "head_dim", str(path))
    assert "option" not in error


@pytest.mark.parametrize(("args", "flag", "code"), [
    (["--head-dim", "0"], "--head-dim", "declared_field_not_positive"),
    (["--layers", "0"], "--layers", "declared_field_not_positive"),
    (["--layers", str(10**15)], "--layers", "model_field_out_of_range"),
    (["--max-model-len", str(10**16)], "--max-model-len", "deployment_field_out_of_range"),
])
def test_a_bad_flag_with_a_config_model_still_names_the_flag(
        tmp_path: Path, args: list[str], flag: str, code: str) -> None:
    path = config_file(tmp_path)
    line = error_line(run("--model", str(path), "--gpu", "H100", *args))
    assert line.startswith(f"error: {flag}: ") and line.endswith(f"[{code}]")


def test_a_null_quantization_config_is_no_quantization(tmp_path: Path) -> None:
    path = config_file(tmp_path, quantization_config=None)
    assert run("--model", str(path), "--gpu", "H100", "--max-model-len", "8192").exit_code == 0


@pytest.mark.parametrize("written", ["{dir}", "./{name}"])
def test_a_directory_without_config_json_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 written: str) -> None:
    empty = tmp_path / "snapshot"
    empty.mkdir()
    monkeypatch.chdir(tmp_path)
    model = written.format(dir=empty, name=empty.name)
    line = error_line(run("--model", model, "--gpu", "H100"))
    assert line == (f"error: --model: directory {model!r} has no config.json "
                    "[config_missing]")


def test_a_path_that_does_not_exist_is_not_looked_up_in_the_catalog(tmp_path: Path) -> None:
    line = error_line(run("--model", str(tmp_path / "nowhere"), "--gpu", "H100"))
    assert line.startswith("error: --model: cannot read model config")
    assert "unknown_model" not in line
