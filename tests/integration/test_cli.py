"""`fleetctl` as a user meets it: exit codes, one-line errors, nothing written on refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.runtime import open_store
from tests.cli_helpers import run_cli
from tests.factories import assess_memory


@pytest.fixture(autouse=True)
def embedded(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    return sqlite_url


def write_lines(path: Path, *payloads: object) -> Path:
    path.write_text("\n".join(p if isinstance(p, str) else json.dumps(p) for p in payloads))
    return path


def log_size(url: str) -> int:
    return open_store(url).head()[0]


def test_submit_with_one_bad_line_exits_2_names_it_and_writes_nothing(
        tmp_path: Path, embedded: str) -> None:
    bad = assess_memory("b")
    bad["deployment"]["kv_shards"] = -1
    source = write_lines(tmp_path / "cmds.jsonl", assess_memory("a"), bad, assess_memory("c"))
    result = run_cli("submit", str(source))
    assert result.exit_code == 2
    assert "line 2: deployment.kv_shards" in result.stderr
    assert "Traceback" not in result.stderr + result.output
    assert log_size(embedded) == 0


def test_submit_decides_in_process_on_the_embedded_default(tmp_path: Path, embedded: str) -> None:
    source = write_lines(tmp_path / "cmds.jsonl", assess_memory("a"),
                         assess_memory("b", max_live_tokens=200_000))
    result = run_cli("submit", str(source), "--wait", "--json")
    assert result.exit_code == 0, result.stderr
    decisions = {d["command_id"]: d["outcome"] for d in json.loads(result.output)["decisions"]}
    assert decisions == {"a": "fits", "b": "does_not_fit"}
    again = run_cli("submit", str(source), "--json")
    assert json.loads(again.output)["already_accepted"] == 2
    assert log_size(embedded) == 4


def test_submit_reads_standard_input(embedded: str) -> None:
    result = run_cli("submit", "-", "--json", input_text=json.dumps([assess_memory("s")]))
    assert result.exit_code == 0 and json.loads(result.output)["accepted"] == 1


def test_a_missing_file_is_a_clear_usage_error(tmp_path: Path) -> None:
    result = run_cli("submit", str(tmp_path / "nope.jsonl"))
    assert result.exit_code == 2 and result.stderr.startswith("error: cannot read")


def test_inspection_commands_answer_in_json(tmp_path: Path) -> None:
    run_cli("submit", str(write_lines(tmp_path / "c.jsonl", assess_memory("x"))))
    for args in (["status"], ["log"], ["explain", "x"], ["verify"], ["replay"],
                 ["replay", "--verify"], ["status", "--at", "1"], ["init"]):
        result = run_cli(*args, "--json")
        assert result.exit_code == 0, (args, result.stderr)
        json.loads(result.output)
    explained = json.loads(run_cli("explain", "x", "--json").output)
    assert explained["chain"][0]["outcome"] == "fits"
    assert explained["chain"][-1]["event_type"] == "CommandAccepted"


def test_explaining_an_unknown_id_exits_2(tmp_path: Path) -> None:
    result = run_cli("explain", "no-such-thing")
    assert result.exit_code == 2 and "no event, command" in result.stderr


def test_replay_with_an_invalid_policy_file_exits_2(tmp_path: Path) -> None:
    policy = tmp_path / "p.json"
    policy.write_text(json.dumps({"memory": {"usable_fraction": 7}}))
    result = run_cli("replay", "--policy", str(policy))
    assert result.exit_code == 2 and "usable_fraction" in result.stderr


@pytest.mark.parametrize("content", [b'{"memory": {"usable_fraction": 0.5}} \xff',
                                     b"[" * 100_000 + b"]" * 100_000],
                         ids=["not_utf8", "nested_too_deeply"])
def test_an_unreadable_policy_file_exits_2_naming_it(tmp_path: Path, content: bytes) -> None:
    policy = tmp_path / "p.json"
    policy.write_bytes(content)
    result = run_cli("replay", "--policy", str(policy))
    assert result.exit_code == 2 and result.stderr.startswith(f"error: policy file {policy}")


def test_replay_to_a_position_shows_the_state_as_of_it(tmp_path: Path) -> None:
    for command_id in ("x", "y"):  # x accepted at 1 and decided at 2, y at 3 and 4
        run_cli("submit", str(write_lines(tmp_path / f"{command_id}.jsonl",
                                          assess_memory(command_id))))
    result = run_cli("replay", "--to", "2")
    assert result.exit_code == 0
    assert result.output.startswith("log position 2;") and "model-x" in result.output
    assert "model-y" not in result.output


def test_replay_to_a_position_past_the_head_stops_at_the_head_as_status_does(
        tmp_path: Path, embedded: str) -> None:
    run_cli("submit", str(write_lines(tmp_path / "c.jsonl", assess_memory("x"))))
    head = log_size(embedded)
    replayed = json.loads(run_cli("replay", "--to", str(head + 100), "--json").output)
    status = json.loads(run_cli("status", "--at", str(head + 100), "--json").output)
    assert replayed["position"] == status["position"] == head
    assert replayed["state"] == status["projections"]


def test_an_unreachable_redis_is_an_operational_failure(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_REDIS_URL", "redis://user:s3cret@127.0.0.1:1/0")
    result = run_cli("submit", str(write_lines(tmp_path / "c.jsonl", assess_memory("x"))))
    assert result.exit_code == 3
    assert "s3cret" not in result.stderr


def test_demo_plans_plays_a_trace_scales_runs_canaries_and_verifies(embedded: str) -> None:
    result = run_cli("demo", "--trace-requests", "150", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.output)
    assert report["projection_differences"] == 0 and report["drifts"] == 0 and report["chain_ok"]
    highlights = {h["what"]: h["outcome"] for h in report["highlights"]}
    assert highlights["plan verdict"] == "release_ready"
    assert highlights["a shed request"] == "shed"
    assert highlights["scale-up"] == "scale_up" and highlights["scale-down"] == "scale_down"
    assert highlights["canary-good verdict"] == "promote"
    assert highlights["canary-bad verdict"] == "rollback"
    played = next(p for p in report["phases"] if p["phase"].startswith("play"))
    assert played["outcomes"]["admit"] == 150 and played["outcomes"]["release"] == 150
    replay = run_cli("replay", "--verify", "--json")
    assert replay.exit_code == 0 and json.loads(replay.output)["drifts"] == []
    assert run_cli("status").exit_code == 0
