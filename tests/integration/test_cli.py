"""`fleetctl` as a user meets it: exit codes, one-line errors, nothing written on refusal."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import threading
from pathlib import Path

import pytest

from controlplane.cli import queue_cmds
from tests.cli_helpers import run_cli
from tests.factories import assess_memory, register_model
from tests.fleet_helpers import log_size


@pytest.fixture(autouse=True)
def embedded(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    return sqlite_url


def write_lines(path: Path, *payloads: object) -> Path:
    path.write_text("\n".join(p if isinstance(p, str) else json.dumps(p) for p in payloads))
    return path




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


def test_explain_names_the_command_an_inbox_line_accepted(tmp_path: Path) -> None:
    # Every accepted command is on the one inbox stream: "#2 CommandAccepted on inbox" alone
    # did not say which command a chain reached.
    run_cli("submit", str(write_lines(tmp_path / "c.jsonl", assess_memory("x"))))
    lines = run_cli("explain", "x").output.splitlines()
    assert lines[-1].endswith("CommandAccepted on inbox: AssessMemory x"), lines


def test_explain_shows_a_command_accepted_but_not_decided_as_awaiting_its_decision(
        tmp_path: Path, embedded: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: "no event, command, request, replica or stream with id", while `status` counted it.
    monkeypatch.setenv("FLEET_REDIS_URL", "redis://127.0.0.1:1/0")
    source = write_lines(tmp_path / "c.jsonl", assess_memory("waiting"))
    assert run_cli("submit", str(source)).exit_code == 3  # accepted, never enqueued
    monkeypatch.delenv("FLEET_REDIS_URL")
    explained = run_cli("explain", "waiting")
    assert explained.exit_code == 0, explained.stderr
    assert "CommandAccepted" in explained.output and "awaiting a decision" in explained.output
    report = json.loads(run_cli("explain", "waiting", "--json").output)
    assert report["awaiting_decision"] is True
    assert report["chain"][0]["command"]["command_id"] == "waiting"


def test_explain_of_an_acceptance_by_its_event_id_says_where_the_command_was_decided(
        tmp_path: Path, embedded: str) -> None:
    # Before: the acceptance alone, with no word of the decision.
    run_cli("submit", str(write_lines(tmp_path / "c.jsonl", assess_memory("x"))))
    report = json.loads(run_cli("explain", "x", "--json").output)
    accepted, decision = report["chain"][-1], report["chain"][0]
    explained = run_cli("explain", accepted["event_id"])
    assert explained.exit_code == 0, explained.stderr
    assert explained.output.splitlines()[-1] == (
        f"    decided at #{decision['position']} (`fleetctl explain x` explains the decision)")
    assert json.loads(run_cli("explain", accepted["event_id"], "--json").output)[
        "awaiting_decision"] is False


def test_explain_takes_a_stream_id_without_a_slash(tmp_path: Path, embedded: str) -> None:
    # Models are registered on the `catalog` stream: `log --stream catalog` listed it, explain
    # refused it.
    run_cli("submit", str(write_lines(tmp_path / "m.jsonl", register_model())))
    explained = json.loads(run_cli("explain", "catalog", "--json").output)
    assert explained["chain"][0]["event_type"] == "ModelRegistered"


def test_explaining_an_unknown_id_exits_2(tmp_path: Path) -> None:
    assert run_cli("init").exit_code == 0
    result = run_cli("explain", "no-such-thing")
    assert result.exit_code == 2 and "no event, command" in result.stderr


@pytest.mark.parametrize("args", [["status"], ["log"], ["explain", "x"], ["verify"], ["replay"],
                                  ["replay", "--verify"], ["status", "--at", "1"]])
def test_a_command_that_reads_the_log_refuses_a_log_that_is_not_there_and_creates_none(
        args: list[str], tmp_path: Path, sqlite_url: str) -> None:
    # Before, it created an empty fleet.db wherever it was run, and reported an empty fleet.
    result = run_cli(*args)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"error: no log at {tmp_path / 'fleet.db'}: ")
    assert "FLEET_DATABASE_URL" in result.stderr
    assert not (tmp_path / "fleet.db").exists()


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


def test_demo_on_a_redis_no_worker_listens_on_exits_3_at_once_and_writes_nothing(
        tmp_path: Path, real_redis: object) -> None:
    """It had waited five minutes for the first phase, silent, then failed (exit 3)."""
    result = run_cli("demo", "--trace-requests", "5")
    assert result.exit_code == 3, result.stderr
    assert result.stderr.startswith("error: no worker listens on queue 'fleet-test-")
    assert "start `fleetctl worker`, or unset FLEET_REDIS_URL" in result.stderr
    assert not (tmp_path / "fleet.db").exists()


@pytest.mark.parametrize("missing", ["everything", "scenarios", "traces"])
def test_demo_with_fixtures_it_cannot_read_exits_2_naming_the_variable_and_writes_nothing(
        tmp_path: Path, embedded: str, monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    # Before, a traceback (exit 1) after the fleet phase had been recorded.
    fixtures = tmp_path / "fixtures"
    if missing != "everything":
        shutil.copytree(ROOT / "fixtures", fixtures)
        shutil.rmtree(fixtures / missing)
    monkeypatch.setenv("FLEET_FIXTURES_DIR", str(fixtures))
    result = run_cli("demo", "--trace-requests", "5")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: FLEET_FIXTURES_DIR: ")
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert not (tmp_path / "fleet.db").exists()


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


ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SCENARIO = ROOT / "fixtures" / "scenarios" / "default.json"
MOONCAKE_TRACE = ROOT / "fixtures" / "traces" / "conversation_trace.first5000.jsonl"
DEEP_JSON = "[" * 100_000 + "]" * 100_000
HUGE_NUMBER_JSON = '{"n": ' + "9" * 5_000 + "}"


@pytest.mark.parametrize(("variable", "value"), [
    ("FLEET_BATCH_SIZE", "10001"), ("FLEET_BATCH_SIZE", "20000"),
    ("FLEET_JOB_TIMEOUT_SECONDS", str(7 * 24 * 3600 + 1)),
    ("FLEET_JOB_TIMEOUT_SECONDS", str(10**20))])
def test_a_batch_size_or_job_timeout_a_job_cannot_carry_is_refused_at_start(
        tmp_path: Path, embedded: str, monkeypatch: pytest.MonkeyPatch, variable: str,
        value: str) -> None:
    # Before, 10,001 commands in one job were refused by every job, and a timeout of 1e20
    # seconds failed inside RQ: either way the commands were recorded and never decided.
    monkeypatch.setenv(variable, value)
    source = write_lines(tmp_path / "c.jsonl", assess_memory("x"))
    for args in (["submit", str(source)], ["reconcile"]):
        result = run_cli(*args)
        assert result.exit_code == 2, (args, result.stderr)
        assert result.stderr.startswith(f"error: {variable} must be at most ")
        assert len(result.stderr.splitlines()) == 1
    assert log_size(embedded) == 0


def test_a_malformed_redis_url_is_refused_before_anything_is_written(
        tmp_path: Path, embedded: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_REDIS_URL", "notaurl")
    result = run_cli("submit", str(write_lines(tmp_path / "c.jsonl", assess_memory("x"))))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: FLEET_REDIS_URL must start with redis://")
    assert log_size(embedded) == 0


def test_an_embedded_submit_wait_stops_at_its_timeout_and_reconcile_decides_the_rest(
        tmp_path: Path, embedded: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The decisions run in this process: before, --timeout was never looked at there.
    monkeypatch.setenv("FLEET_BATCH_SIZE", "1")  # a job a command: the stop comes between them
    source = write_lines(tmp_path / "c.jsonl", *(assess_memory(name) for name in "abc"))
    result = run_cli("submit", str(source), "--wait", "--timeout", "1e-6")
    assert result.exit_code == 3
    assert result.stderr == ("error: 2 command(s) undecided after 1e-06s; the rest stay in the "
                             "inbox: `fleetctl reconcile` decides them\n")
    assert log_size(embedded) == 4  # three accepted, the first decided
    assert run_cli("reconcile").exit_code == 0
    assert log_size(embedded) == 6
    # Without --wait the embedded queue decides everything, whatever --timeout says.
    more = write_lines(tmp_path / "d.jsonl", *(assess_memory(name) for name in "def"))
    assert run_cli("submit", str(more), "--timeout", "1e-6").exit_code == 0
    assert log_size(embedded) == 12


def test_resubmitting_commands_accepted_but_undecided_decides_them(
        tmp_path: Path, embedded: str, monkeypatch: pytest.MonkeyPatch) -> None:
    source = write_lines(tmp_path / "c.jsonl", assess_memory("a"), assess_memory("b"))
    monkeypatch.setenv("FLEET_REDIS_URL", "redis://127.0.0.1:1/0")
    assert run_cli("submit", str(source)).exit_code == 3  # recorded, never enqueued
    monkeypatch.delenv("FLEET_REDIS_URL")
    result = run_cli("submit", str(source), "--json", "--timeout", "5")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.output)
    assert (report["accepted"], report["already_accepted"], report["jobs"]) == (0, 2, 1)
    assert {d["command_id"]: d["outcome"] for d in report["decisions"]} == {"a": "fits",
                                                                            "b": "fits"}


def test_an_embedded_submit_leaves_the_signal_handlers_it_found(tmp_path: Path) -> None:
    # RQ's in-process worker installed its own and left them: a later Ctrl-C raised
    # StopRequested from wherever the process was, a traceback and exit 1.
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    result = run_cli("submit", str(write_lines(tmp_path / "c.jsonl", assess_memory("x"))))
    assert result.exit_code == 0, result.stderr
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_replay_rebuild_with_a_bad_policy_file_rebuilds_nothing(tmp_path: Path,
                                                               embedded: str) -> None:
    run_cli("submit", str(write_lines(tmp_path / "c.jsonl", assess_memory("x"))))
    head = log_size(embedded)
    policy = tmp_path / "p.json"
    policy.write_text(json.dumps({"memory": {"usable_fraction": 7}}))
    result = run_cli("replay", "--rebuild", "--policy", str(policy))
    assert result.exit_code == 2 and "usable_fraction" in result.stderr
    assert log_size(embedded) == head  # no ProjectionsRebuilt


def test_plan_with_an_unwritable_output_submits_nothing(tmp_path: Path, embedded: str) -> None:
    result = run_cli("plan", str(DEFAULT_SCENARIO), "--output", str(tmp_path / "no" / "p.json"))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --output ") and "does not exist" in result.stderr
    assert log_size(embedded) == 0


def test_simulate_with_an_unwritable_chart_runs_nothing(tmp_path: Path) -> None:
    log = tmp_path / "sim.db"
    result = run_cli("simulate", str(MOONCAKE_TRACE), "--limit", "5", "--log", str(log),
                     "--chart", str(tmp_path / "no" / "c.svg"))
    assert result.exit_code == 2 and result.stderr.startswith("error: --chart ")
    assert not log.exists()


def _bad_input_cases(tmp_path: Path) -> dict[str, list[str]]:
    files = {"deep.json": DEEP_JSON, "huge.json": HUGE_NUMBER_JSON,
             "deep.jsonl": DEEP_JSON + "\n", "huge.jsonl": HUGE_NUMBER_JSON + "\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "logdir").mkdir()
    return {
        "log_from_past_64_bits": ["log", "--from", str(2**63)],
        "explain_not_utf8": ["explain", "\udcff"],
        "log_filter_not_utf8": ["log", "--command", "\udcff"],
        "plan_nested_too_deeply": ["plan", str(tmp_path / "deep.json")],
        "plan_number_past_the_digit_limit": ["plan", str(tmp_path / "huge.json")],
        "policy_number_past_the_digit_limit": ["replay", "--policy", str(tmp_path / "huge.json")],
        "fit_model_nested_too_deeply": ["fit", "--model", str(tmp_path / "deep.json"),
                                        "--gpu", "H100-SXM-80GB"],
        "simulate_trace_nested_too_deeply": ["simulate", str(tmp_path / "deep.jsonl")],
        "simulate_trace_number_past_the_digit_limit": ["simulate", str(tmp_path / "huge.jsonl")],
        "simulate_log_a_directory": ["simulate", str(MOONCAKE_TRACE), "--limit", "5",
                                     "--log", str(tmp_path / "logdir"), "--overwrite"],
        "up_port_past_65535": ["up", "--port", "99999"],
    }


CASES = ["log_from_past_64_bits", "explain_not_utf8", "log_filter_not_utf8",
         "plan_nested_too_deeply", "plan_number_past_the_digit_limit",
         "policy_number_past_the_digit_limit", "fit_model_nested_too_deeply",
         "simulate_trace_nested_too_deeply", "simulate_trace_number_past_the_digit_limit",
         "simulate_log_a_directory", "up_port_past_65535"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_exit_2_never_a_traceback(tmp_path: Path, embedded: str,
                                                            case: str) -> None:
    args = _bad_input_cases(tmp_path)[case]
    result = run_cli(*args)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, \
        result.stderr
    assert log_size(embedded) == 0


def test_up_on_a_port_in_use_is_an_operational_failure_in_one_line(embedded: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("up", "--port", str(port), "--workers", "0")
    assert result.exit_code == 3
    assert result.stderr.startswith(f"error: cannot serve the embedded Redis on 127.0.0.1:{port}")


@pytest.mark.parametrize("args", [["submit"], ["plan"], ["replay", "--policy"],
                                  ["fit", "--gpu", "H100-SXM-80GB", "--model"]],
                         ids=["submit", "plan", "replay_policy", "fit_model"])
def test_an_endless_file_is_read_no_further_than_the_limit(
        tmp_path: Path, embedded: str, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    # /dev/zero has no size to check first: reading it whole ran the process out of memory.
    monkeypatch.setattr(queue_cmds, "MAX_SUBMISSION_BYTES", 1_000_000)
    endless = tmp_path / "zero.json"  # `fit --model` takes a name ending .json as a file
    endless.symlink_to("/dev/zero")
    result = run_cli(*args, str(endless))
    assert result.exit_code == 2, result.stderr
    assert "larger than" in result.stderr and len(result.stderr.splitlines()) == 1
    assert log_size(embedded) == 0


def test_a_fifo_that_never_ends_is_refused_past_the_limit(
        tmp_path: Path, embedded: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_cmds, "MAX_SUBMISSION_BYTES", 1_000_000)
    fifo = tmp_path / "commands"
    os.mkfifo(fifo)

    def write_forever() -> None:
        with contextlib.suppress(BrokenPipeError), fifo.open("wb") as pipe:
            while True:
                pipe.write(b" " * 65_536)

    writer = threading.Thread(target=write_forever, daemon=True)
    writer.start()
    result = run_cli("submit", str(fifo))
    assert result.exit_code == 2 and "larger than 1000000 bytes" in result.stderr
    writer.join(timeout=10)


@pytest.mark.filterwarnings("ignore:Query string argument")
def test_simulate_never_shows_the_password_of_its_log_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/sim.db?password=hunter2"
    args = ["simulate", str(MOONCAKE_TRACE), "--limit", "5", "--no-chart", "--log", url]
    as_json = run_cli(*args, "--json")
    assert as_json.exit_code == 0, as_json.stderr
    assert json.loads(as_json.output)["log"] == f"sqlite:///{tmp_path}/sim.db"
    refused = run_cli(*args)  # the log now holds events
    assert refused.exit_code == 2 and "already holds events" in refused.stderr
    (tmp_path / "sim.db").unlink()
    human = run_cli(*args)
    assert human.exit_code == 0, human.stderr
    for result in (as_json, refused, human):
        assert "hunter2" not in result.output + result.stderr


def test_an_unusable_log_url_names_the_log_option(tmp_path: Path) -> None:
    result = run_cli("simulate", str(MOONCAKE_TRACE), "--limit", "5", "--no-chart",
                     "--log", "nosuchdriver://user:hunter2@host/db")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --log is not a usable database URL")
    assert "hunter2" not in result.stderr


def test_worker_answers_in_json(tmp_path: Path, embedded: str) -> None:
    run_cli("submit", str(write_lines(tmp_path / "c.jsonl", assess_memory("x"))))
    result = run_cli("worker", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.output) == {"queue": "embedded", "re_enqueued": 0,
                                         "decided_in_process": True}


def test_an_embedded_worker_prints_its_result_on_stdout(tmp_path: Path, embedded: str) -> None:
    # It went to stderr: `fleetctl worker 2>/dev/null` printed nothing.
    result = run_cli("worker")
    assert result.exit_code == 0, result.stderr
    assert result.output == "embedded queue: decided 0 pending command(s) in-process\n"


def _drifting_assess_memory(monkeypatch: pytest.MonkeyPatch, new_version: int | None) -> None:
    """Today's AssessMemory decides every command the other way; with `new_version`, its rules
    version was bumped to say so (an upgrade); without, it was not (a fault)."""
    from controlplane import handlers

    original = handlers.HANDLERS["AssessMemory"]

    def flipped(command, ctx):  # type: ignore[no-untyped-def]
        appends = original(command, ctx)
        for append in appends:
            for event in append.events:
                if "outcome" in event.data:
                    event.data["outcome"] = "flipped"
        return appends

    monkeypatch.setitem(handlers.HANDLERS, "AssessMemory", flipped)
    if new_version is not None:
        monkeypatch.setitem(handlers.RULES_VERSIONS, "AssessMemory", new_version)


def test_replay_verify_passes_a_drift_made_under_older_rules_and_fails_one_under_todays(
        tmp_path: Path, embedded: str, monkeypatch: pytest.MonkeyPatch) -> None:
    source = write_lines(tmp_path / "cmds.jsonl", assess_memory("a"))
    assert run_cli("submit", str(source)).exit_code == 0
    with monkeypatch.context() as upgraded:
        _drifting_assess_memory(upgraded, new_version=2)
        result = run_cli("replay", "--verify")
        assert result.exit_code == 0, result.output
        assert "1 of them decided under older rules than today's" in result.output
        assert "rules 1 -> 2" in result.output
        as_json = json.loads(run_cli("replay", "--verify", "--json").output)
        assert as_json["unexplained_drifts"] == 0 and as_json["drifts"][0]["older_rules"]
        # A what-if says its differences may be the upgrade's (it had counted them as its own).
        policy = tmp_path / "whatif.json"
        policy.write_text('{"memory": {"usable_fraction": 0.8}}', encoding="utf-8")
        what_if = run_cli("replay", "--policy", str(policy))
        assert what_if.exit_code == 0, what_if.stderr
        assert "1 of them decided under older rules than today's: they may differ by the " \
               "upgrade, not the what-if" in what_if.output
    with monkeypatch.context() as broken:
        _drifting_assess_memory(broken, new_version=None)
        result = run_cli("replay", "--verify")
        assert result.exit_code == 1
        assert "older rules" not in result.output and "1 would differ" in result.output
    assert run_cli("replay", "--verify").exit_code == 0


def test_explain_text_names_each_node_a_refused_placement_ruled_out_and_why(
        tmp_path: Path, embedded: str) -> None:
    """DESIGN: for a refusal, why each alternative was ruled out; not only in --json."""
    from tests.factories import place_replica, register_model, register_node

    source = write_lines(tmp_path / "cmds.jsonl", register_node("n1", gpus=4),
                         register_node("n2", gpus=2, rack="rack-1"), register_model(),
                         place_replica("r1", tp=8))
    assert run_cli("submit", str(source)).exit_code == 0
    result = run_cli("explain", "place-r1")
    assert result.exit_code == 0
    assert "ruled out node:n1: locality (4 GPUs, 4 eligible)" in result.output
    assert "ruled out node:n2: locality (2 GPUs, 2 eligible)" in result.output
