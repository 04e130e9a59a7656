"""`fleetctl submit` with garbage on stdin: exit 0 or 2, never a traceback, nothing written on
refusal; through the in-process CLI (hypothesis) and a real process fed raw bytes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given

from controlplane.errors import InputError
from controlplane.gateway.fixture_provider import FIXTURE_DIR_ENV
from controlplane.runtime import open_store
from controlplane.submission import read_submission
from events.store import EventStore
from tests.cli_helpers import run_cli
from tests.factories import assess_memory
from tests.fuzz.strategies import fuzz_settings, garbage_texts

ROOT = Path(__file__).resolve().parents[2]
RAW_SEED = 20261130


@pytest.fixture
def fleet_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EventStore]:
    """An embedded fleet on a private SQLite file, exported for the CLI."""
    url = f"sqlite:///{tmp_path}/fleet.db"
    monkeypatch.setenv("FLEET_DATABASE_URL", url)
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    monkeypatch.setenv("FLEET_QUEUE", "fleet-garbage")
    monkeypatch.setenv(FIXTURE_DIR_ENV, str(tmp_path / "provider"))
    store = open_store(url)
    yield store
    store.engine.dispose()


def _cli_text(text: str) -> str:
    # The in-process runner must encode stdin itself; lone surrogates go through the real
    # process below as raw bytes instead.
    return text.encode("utf-8", errors="replace").decode("utf-8")


@fuzz_settings(200)
@given(garbage_texts())
def test_garbage_on_stdin_exits_0_or_2_without_a_traceback_and_a_refusal_writes_nothing(
        fleet_env: EventStore, text: str) -> None:
    head = fleet_env.head()
    result = run_cli("submit", "-", input_text=_cli_text(text))
    assert result.exit_code in (0, 2), (result.exit_code, result.output, result.stderr)
    assert "Traceback" not in result.output + result.stderr
    if result.exit_code == 2:
        assert fleet_env.head() == head
        assert result.stderr.strip(), "a refusal says why"


def _run_submit(stdin: bytes, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[bytes]:
    # The C locale, whose stdin hands undecodable bytes on as lone surrogates, unless `env` says
    # otherwise (the strict decoding of other UTF-8 locales is a known bug with its own test).
    environment = {**os.environ, "FLEET_DATABASE_URL": f"sqlite:///{tmp_path}/fleet.db",
                   "FLEET_QUEUE": "fleet-garbage", FIXTURE_DIR_ENV: str(tmp_path / "provider"),
                   "PYTHONPATH": str(ROOT), "LC_ALL": "C", **env}
    environment.pop("FLEET_REDIS_URL", None)
    if "PYTHONIOENCODING" not in env:
        environment.pop("PYTHONIOENCODING", None)
    return subprocess.run([sys.executable, "-m", "controlplane.cli.main", "submit", "-"], input=stdin,
                          capture_output=True, env=environment, cwd=tmp_path, timeout=120, check=False)


def _random_bytes() -> bytes:
    print(f"raw-bytes seed: {RAW_SEED} (random.Random({RAW_SEED}).randbytes(4096))")
    return random.Random(RAW_SEED).randbytes(4096)


RAW_INPUTS = {
    "invalid_start_byte": b"\xff\xfe{\"type\": \"AssessMemory\"}\n",
    "truncated_multibyte": json.dumps(assess_memory("raw-a")).encode()[:-3] + b"\xc3\n",
    "nul_bytes": b"\x00" * 64 + b"\n" + json.dumps(assess_memory("raw-b")).encode(),
    "utf16_command": json.dumps(assess_memory("raw-c")).encode("utf-16"),
    "latin1_in_a_string": json.dumps(assess_memory("raw-d")).replace("model-raw-d", "mod\xe8le").encode(
        "latin-1"),
}


@pytest.mark.parametrize("name", ["all_fixed_inputs", "random"])
def test_raw_bytes_on_a_real_stdin_exit_2_without_a_traceback_and_write_nothing(
        name: str, tmp_path: Path) -> None:
    stdin = _random_bytes() if name == "random" else b"\n".join(RAW_INPUTS.values())
    completed = _run_submit(stdin, tmp_path)
    output = (completed.stdout + completed.stderr).decode("utf-8", errors="replace")
    assert completed.returncode == 2, output
    assert "Traceback" not in output
    store = open_store(f"sqlite:///{tmp_path}/fleet.db")
    assert store.head()[0] == 0
    store.engine.dispose()


@pytest.mark.parametrize("name", sorted(RAW_INPUTS))
def test_raw_bytes_as_stdin_decodes_them_are_refused_with_a_typed_error(name: str) -> None:
    # What a C/POSIX-locale stdin hands the reader: undecodable bytes as lone surrogates.
    with pytest.raises(InputError):
        read_submission(RAW_INPUTS[name].decode("utf-8", errors="surrogateescape"))


def test_non_utf8_stdin_is_refused_whatever_the_locale(tmp_path: Path) -> None:
    completed = _run_submit(RAW_INPUTS["invalid_start_byte"], tmp_path, PYTHONIOENCODING="utf-8:strict")
    output = (completed.stdout + completed.stderr).decode("utf-8", errors="replace")
    assert "Traceback" not in output
    assert completed.returncode == 2


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000,
                                  json.dumps({"type": "SetPolicy", "name": "memory", "parameters": {
                                      "x": "NEST"}}).replace('"NEST"', "[" * 5_000 + "]" * 5_000)])
def test_json_nested_beyond_the_parser_limit_is_refused_as_bad_input(text: str) -> None:
    with pytest.raises(InputError):
        read_submission(text)


@pytest.mark.parametrize("array", [False, True])
def test_a_number_longer_than_python_converts_is_refused_as_bad_input(array: bool) -> None:
    line = json.dumps(assess_memory("huge")).replace("8000000000", "9" * 5_000)
    with pytest.raises(InputError):
        read_submission(f"[{line}]" if array else line)


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_a_string_holding_a_unicode_line_separator_stays_one_command(separator: str) -> None:
    payload = {"type": "Dispatch", "command_id": "sep", "tenant": "acme", "principal_id": "alice",
               "idempotency_key": "k-sep", "pointer_name": "acme/assistant", "input": f"one{separator}two"}
    submission = read_submission(json.dumps(payload, ensure_ascii=False))
    assert [c.model_dump()["input"] for c in submission.commands] == [f"one{separator}two"]
