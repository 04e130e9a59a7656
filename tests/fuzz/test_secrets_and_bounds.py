"""No password reaches output, errors or logs; oversized input is refused with exit 2, quickly,
having written nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import controlplane.submission as submission_module
from controlplane.gateway.scenario import route
from controlplane.runtime import open_store
from events.store import EventStore
from tests.cli_helpers import run_cli
from tests.factories import assess_memory
from workers.runner import EmbeddedRedisServer

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t"
UNREACHABLE_DATABASE = f"postgresql+psycopg://user:{SECRET}@127.0.0.1:1/x"
UNREACHABLE_REDIS = f"redis://:{SECRET}@127.0.0.1:1/0"
SUBCOMMANDS = [["status"], ["log"], ["reconcile"], ["worker", "--burst"], ["init"], ["verify"],
               ["replay"], ["replay", "--verify"], ["explain", "some-id"]]


@pytest.fixture
def command_file(tmp_path: Path) -> Path:
    path = tmp_path / "commands.jsonl"
    path.write_text(json.dumps(assess_memory("secret-test")) + "\n")
    return path


@pytest.fixture
def sqlite_fleet(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[EventStore]:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    monkeypatch.setenv("FLEET_QUEUE", "fleet-bounds")
    store = open_store(sqlite_url)
    yield store
    store.engine.dispose()


def _assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text, text[-2_000:]


def test_an_unreachable_database_exits_3_and_no_command_shows_its_password(
        command_file: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("FLEET_DATABASE_URL", UNREACHABLE_DATABASE)
    monkeypatch.setenv("FLEET_REDIS_URL", UNREACHABLE_REDIS)
    for args in [["submit", str(command_file)], *SUBCOMMANDS]:
        result = run_cli("--log-level", "DEBUG", *args)
        assert result.exit_code == 3, (args, result.stderr)
        assert "Traceback" not in result.output + result.stderr
        _assert_no_secret(result.output, result.stderr)
    _assert_no_secret(caplog.text)


def test_an_unreachable_redis_exits_3_and_no_command_shows_its_password(
        command_file: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("FLEET_REDIS_URL", UNREACHABLE_REDIS)
    for args in [["submit", str(command_file)], ["reconcile"], ["worker", "--burst"]]:
        result = run_cli("--log-level", "DEBUG", *args)
        assert result.exit_code == 3, (args, result.stderr)
        assert "Traceback" not in result.output + result.stderr
        _assert_no_secret(result.output, result.stderr)
    _assert_no_secret(caplog.text)


def _fleetctl(args: list[str], env: dict[str, str], stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "FLEET_LOG_LEVEL": "DEBUG", **env}
    return subprocess.run([sys.executable, "-m", "controlplane.cli.main", *args], input=stdin.decode(),
                          capture_output=True, text=True, env=environment, timeout=120, check=False)


def _json_log_lines(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_a_real_process_with_unreachable_servers_exits_3_without_showing_a_password(tmp_path: Path) -> None:
    completed = _fleetctl(["submit", "-"], {"FLEET_DATABASE_URL": UNREACHABLE_DATABASE,
                                            "FLEET_REDIS_URL": UNREACHABLE_REDIS},
                          stdin=json.dumps(assess_memory("secret-process")).encode())
    assert completed.returncode == 3, completed.stderr
    assert "Traceback" not in completed.stderr
    _assert_no_secret(completed.stdout, completed.stderr)


def test_workers_on_a_password_protected_redis_log_json_without_the_password(
        tmp_path: Path, command_file: Path) -> None:
    with EmbeddedRedisServer() as server:
        env = {"FLEET_DATABASE_URL": f"sqlite:///{tmp_path}/fleet.db", "FLEET_QUEUE": "fleet-secrets",
               "FLEET_REDIS_URL": server.url.replace("redis://", f"redis://:{SECRET}@")}
        submitted = _fleetctl(["submit", str(command_file)], env)
        worked = _fleetctl(["worker", "--burst"], env)
    assert (submitted.returncode, worked.returncode) == (0, 0), submitted.stderr + worked.stderr
    logs = _json_log_lines(worked.stderr)
    assert any(line.get("event") == "batch_decided" for line in logs), worked.stderr
    _assert_no_secret(submitted.stdout, submitted.stderr, worked.stdout, worked.stderr)


def test_a_password_in_the_redis_url_query_is_never_shown(sqlite_url: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_REDIS_URL", f"redis://127.0.0.1:1/0?password={SECRET}")
    result = run_cli("reconcile")
    assert result.exit_code == 3
    _assert_no_secret(result.output, result.stderr)


@pytest.mark.parametrize("variable", ["FLEET_DATABASE_URL", "FLEET_REDIS_URL"])
def test_a_malformed_server_url_is_refused_in_one_line_without_its_password(
        variable: str, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scheme = "postgresql+psycopg" if variable == "FLEET_DATABASE_URL" else "redis"
    monkeypatch.setenv(variable, f"{scheme}://user:{SECRET}@127.0.0.1:notaport/0")
    result = run_cli("reconcile")
    assert result.exit_code in (2, 3)
    _assert_no_secret(result.output, result.stderr)


def _refused_quickly(sqlite_fleet: EventStore, text: str) -> str:
    head, started = sqlite_fleet.head(), time.monotonic()
    result = run_cli("submit", "-", input_text=text)
    assert time.monotonic() - started < 15
    assert result.exit_code == 2, result.stderr
    assert sqlite_fleet.head() == head
    return result.stderr


def test_a_line_longer_than_the_line_bound_is_refused_with_exit_2(sqlite_fleet: EventStore) -> None:
    payload = assess_memory("long", model_name="m" * (submission_module.MAX_LINE_BYTES + 1))
    stderr = _refused_quickly(sqlite_fleet, json.dumps(assess_memory("short")) + "\n" + json.dumps(payload))
    assert "line 2: (line):" in stderr


def test_more_commands_than_the_bound_are_refused_with_exit_2(
        sqlite_fleet: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(submission_module, "MAX_COMMANDS", 100)
    commands = [json.dumps(assess_memory(f"many-{i}")) for i in range(101)]
    for text in ("\n".join(commands), "[" + ",".join(commands) + "]"):
        stderr = _refused_quickly(sqlite_fleet, text)
        assert "101" in stderr and "100" in stderr  # the count and the bound, not a field problem
        assert "line " not in stderr


def test_a_submission_larger_than_the_size_bound_is_refused_with_exit_2(
        sqlite_fleet: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(submission_module, "MAX_SUBMISSION_BYTES", 10_000)
    commands = [json.dumps(assess_memory(f"big-{i}")) for i in range(40)]
    stderr = _refused_quickly(sqlite_fleet, "\n".join(commands))
    assert "10000" in stderr and "line " not in stderr


def test_the_line_bound_counts_bytes_not_characters(sqlite_fleet: EventStore) -> None:
    wide = "\U0001F600" * (submission_module.MAX_LINE_BYTES // 4 + 1)  # 4 UTF-8 bytes each
    payload = {"type": "ReconcileOperation", "command_id": "wide", "tenant": "acme",
               "idempotency_key": "k-wide", "resolution": "not_processed", "evidence_ref": "e",
               "note": wide}
    assert "line 1: (line):" in _refused_quickly(sqlite_fleet, json.dumps(payload, ensure_ascii=False))


def test_a_command_too_large_for_a_line_is_too_large_in_an_array(sqlite_fleet: EventStore) -> None:
    payload = {"type": "Dispatch", "command_id": "huge-input", "tenant": "acme", "principal_id": "alice",
                "idempotency_key": "k-huge", "pointer_name": "acme/assistant",
                "input": "w " * (submission_module.MAX_LINE_BYTES // 2 + 1)}
    _refused_quickly(sqlite_fleet, json.dumps(payload))
    _refused_quickly(sqlite_fleet, json.dumps([payload]))


@pytest.mark.parametrize(("field", "value"), [
    ("prices.input_price_per_token", 1.7e308), ("prices.output_price_per_token", 1.7e308),
    ("economics.cost_units_per_hour", 1.7e308), ("economics.busy_requests_per_second", 5e-324),
    ("economics.utilisation", 5e-324)])
def test_route_pricing_that_could_make_a_cost_unrecordable_is_refused_at_the_edge(
        sqlite_fleet: EventStore, field: str, value: float) -> None:
    # Before the bounds, 1.7e308 per token made the hosted cost inf: the completed answer could not
    # be stored and the call was recorded persist_failed with its grant held. A route recorded
    # before the bounds is denied at reserve instead (tests/integration/test_gateway_pricing.py).
    pricing = {"prices": {"input_price_per_token": 0.5, "output_price_per_token": 0.5},
               "economics": {"cost_units_per_hour": 10.0, "busy_requests_per_second": 20.0,
                             "utilisation": 0.5}}
    group, name = field.split(".")
    payload = {**route("hc-1").payload(), group: {**pricing[group], name: value}}
    assert field in _refused_quickly(sqlite_fleet, json.dumps(payload))
