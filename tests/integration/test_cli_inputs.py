"""`fleetctl`'s options and settings as a user gives them: a bad value is refused in one line
with exit 2 and nothing written; long work shows progress on a terminal only; the Procfile's
workers serve the queue commands go to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.cli import context, output, queue_cmds
from controlplane.errors import OperationalError
from controlplane.logging import LOG_LEVEL_NAMES, configure_logging
from controlplane.runtime import open_store
from controlplane.service import pending_command_ids
from events.model import StreamAppend
from tests.cli_helpers import run_cli
from tests.factories import assess_memory, event
from tests.fleet_helpers import log_size
from workers.runner import EmbeddedRedisServer

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SCENARIO = ROOT / "fixtures" / "scenarios" / "default.json"
MOONCAKE_TRACE = ROOT / "fixtures" / "traces" / "conversation_trace.first5000.jsonl"
UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"


@pytest.fixture(autouse=True)
def embedded(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    monkeypatch.delenv("FLEET_QUEUE", raising=False)
    monkeypatch.delenv("FLEET_LOG_LEVEL", raising=False)
    yield sqlite_url
    configure_logging("WARNING")  # as the session began: a test's level must not leak


def database_file(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))




def commands_file(tmp_path: Path, *command_ids: str) -> Path:
    path = tmp_path / "commands.jsonl"
    path.write_text("\n".join(json.dumps(assess_memory(c)) for c in command_ids))
    return path


def assert_refused_in_one_line(result: Any, *named: str) -> None:
    """Exit 2 and one line on stderr that names each of `named` (in any case)."""
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, \
        result.stderr
    for name in named:
        assert name.lower() in result.stderr.lower(), result.stderr


# 1 (a): the log level


@pytest.mark.parametrize("given", ["environment", "option"])
def test_an_unknown_log_level_is_refused_naming_the_valid_ones(
        embedded: str, monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    # Before, `bogus` fell back to WARNING silently and `status` exited 0.
    if given == "environment":
        monkeypatch.setenv("FLEET_LOG_LEVEL", "bogus")
        result = run_cli("status")
        assert_refused_in_one_line(result, "FLEET_LOG_LEVEL", "bogus", *LOG_LEVEL_NAMES)
    else:
        result = run_cli("--log-level", "bogus", "status")
        assert_refused_in_one_line(result, "--log-level", "bogus", *LOG_LEVEL_NAMES)
    assert result.output == ""
    assert not database_file(embedded).exists()


@pytest.mark.parametrize(("variable", "option"), [("debug", None), ("Error", None),
                                                  (None, "info"), ("bogus", "CRITICAL")])
def test_the_standard_log_levels_are_accepted_in_any_case(
        monkeypatch: pytest.MonkeyPatch, variable: str | None, option: str | None) -> None:
    assert run_cli("init").exit_code == 0
    if variable is not None:
        monkeypatch.setenv("FLEET_LOG_LEVEL", variable)
    args = ["--log-level", option] if option is not None else []
    result = run_cli(*args, "status", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.output)["position"] == 0


# 1 (b): how long to wait


BAD_SECONDS = ["-1", "0", "nan", "NaN", "inf", "-inf", str(7 * 24 * 3600 + 1), "1e300"]


@pytest.mark.parametrize("seconds", BAD_SECONDS)
def test_a_submit_wait_timeout_that_is_not_a_finite_positive_number_is_refused(
        tmp_path: Path, embedded: str, seconds: str) -> None:
    # Before, `--timeout -1` and `--timeout nan` recorded and decided the commands, exit 0.
    result = run_cli("submit", str(commands_file(tmp_path, "a")), "--wait",
                     "--timeout", seconds)
    assert_refused_in_one_line(result, "--timeout")
    assert log_size(embedded) == 0


def test_a_submit_wait_timeout_at_its_bound_is_accepted(tmp_path: Path) -> None:
    result = run_cli("submit", str(commands_file(tmp_path, "a")), "--wait", "--json",
                     "--timeout", str(7 * 24 * 3600))
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.output)["decisions"][0]["outcome"] == "fits"


@pytest.mark.parametrize("seconds", ["-1", "nan"])
def test_a_plan_timeout_that_is_not_a_finite_positive_number_is_refused(
        tmp_path: Path, embedded: str, seconds: str) -> None:
    result = run_cli("plan", str(DEFAULT_SCENARIO), "--output", str(tmp_path / "plan.json"),
                     "--timeout", seconds)
    assert_refused_in_one_line(result, "--timeout")
    assert log_size(embedded) == 0


# 1 (c): how many worker processes


@pytest.mark.parametrize("redis_url", [None, UNREACHABLE_REDIS], ids=["embedded", "unreachable"])
@pytest.mark.parametrize("processes", ["-3", "0", "65"])
def test_a_worker_process_count_out_of_bounds_is_refused_before_connecting(
        embedded: str, monkeypatch: pytest.MonkeyPatch, redis_url: str | None,
        processes: str) -> None:
    # Before, -3 exited 0 on the embedded default, and failed on the connection (exit 3) with
    # an unreachable Redis.
    if redis_url is not None:
        monkeypatch.setenv("FLEET_REDIS_URL", redis_url)
    result = run_cli("worker", "--processes", processes)
    assert_refused_in_one_line(result, "--processes", processes)
    assert not database_file(embedded).exists()


@pytest.mark.parametrize("workers", ["-1", "65"])
def test_an_up_worker_count_out_of_bounds_is_refused(
        embedded: str, monkeypatch: pytest.MonkeyPatch, workers: str) -> None:
    def started(*_: object) -> None:  # a count let through must not start 65 workers, or serve
        raise OperationalError("up started")

    monkeypatch.setattr(queue_cmds, "settings_and_store", started)
    result = run_cli("up", "--workers", workers)
    assert_refused_in_one_line(result, "--workers", workers)
    assert not database_file(embedded).exists()


@pytest.mark.parametrize(("policies", "named"), [
    ({"memory": 0.8}, ["'memory'", "an object", "a number"]),
    ({"memory": None}, ["'memory'", "null"]),
    ({"nopolicy": 3}, ["unknown policy 'nopolicy'"]),
    ({"rollout": {"canary_traffic_percents": [10, 1]}}, ["canary_traffic_percents", "increase"]),
    ({"rollout": {"required_gates": ["quantization"] * 2}}, ["required_gates", "repeat"])],
    ids=["number", "null", "unknown", "steps_down", "gates_repeat"])
def test_a_what_if_file_wrong_in_itself_is_refused_whatever_the_log_holds(
        tmp_path: Path, embedded: str, policies: dict[str, Any], named: list[str]) -> None:
    # A rule of one field was checked only against a version recorded in the log: on a log
    # without one, the file passed; a policy that is no object was "memory.: Extra inputs".
    assert run_cli("submit", str(commands_file(tmp_path, "a"))).exit_code == 0
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(policies))
    assert_refused_in_one_line(run_cli("replay", "--policy", str(policy)), *named)


# 2: progress on a terminal


def log_of_decisions_and_many_events(tmp_path: Path, url: str, events: int) -> int:
    """One decided command, then `events` plain events: enough for verify to report progress
    (every 10,000 events read). Returns the head position."""
    assert run_cli("submit", str(commands_file(tmp_path, "a"))).exit_code == 0
    store = open_store(url)
    for first in range(0, events, 5_000):
        store.append([StreamAppend(f"test/bulk-{first}", None,
                                   [event(str(slot), command_id="bulk")
                                    for slot in range(first, first + 5_000)])])
    head = store.head()[0]
    store.engine.dispose()
    return head


@pytest.mark.parametrize(("args", "label"), [
    (["--verify"], "verify: events read"), (["--verify", "--json"], "verify: events read"),
    (["--policy"], "what-if: events read"), ([], "replay: events folded"),
    (["--to", "HEAD"], "replay: events folded"), (["--rebuild"], "rebuild: events folded")],
    ids=["verify", "verify_json", "what_if", "compare", "to", "rebuild"])
def test_replay_shows_events_read_out_of_the_head_on_a_terminal(
        tmp_path: Path, embedded: str, monkeypatch: pytest.MonkeyPatch, args: list[str],
        label: str) -> None:
    # Before, `replay --verify` read a 100,000-event log for ~20 s printing nothing, and plain
    # `replay`, `--to` and `--rebuild` fold the whole log as silently.
    head = log_of_decisions_and_many_events(tmp_path, embedded, 20_000)
    if args == ["--policy"]:
        policy = tmp_path / "policy.json"
        policy.write_text("{}")
        args = ["--policy", str(policy)]
    args = [str(head) if arg == "HEAD" else arg for arg in args]
    monkeypatch.setattr(output, "stderr_is_terminal", lambda: True)
    result = run_cli("replay", *args)
    assert result.exit_code == 0, result.stderr
    assert label in result.stderr
    assert f"20000/{head}" in result.stderr
    if "--json" in args:  # the bar is on stderr: stdout is the report alone
        assert json.loads(result.output)["decisions_checked"] == 1


@pytest.mark.parametrize("args", [["--verify"], ["--verify", "--json"], [], ["--to", "3"],
                                  ["--rebuild"]],
                         ids=["verify", "verify_json", "compare", "to", "rebuild"])
def test_replay_writes_nothing_to_stderr_when_it_is_not_a_terminal(
        tmp_path: Path, embedded: str, args: list[str]) -> None:
    log_of_decisions_and_many_events(tmp_path, embedded, 10_000)
    result = run_cli("replay", *args)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""


def test_simulate_shows_its_progress_on_a_terminal_and_nothing_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["simulate", str(MOONCAKE_TRACE), "--limit", "20", "--no-chart", "--json"]
    quiet = run_cli(*args, "--log", str(tmp_path / "quiet.db"))
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr
    monkeypatch.setattr(output, "stderr_is_terminal", lambda: True)
    shown = run_cli(*args, "--log", str(tmp_path / "shown.db"))
    assert shown.exit_code == 0, shown.stderr
    assert "simulating" in shown.stderr and "20/20" in shown.stderr
    assert json.loads(shown.output)["requests"] == json.loads(quiet.output)["requests"]


# 3: one line per error


def test_an_error_message_of_several_lines_is_shown_on_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(_: object, **__: object) -> None:
        raise OperationalError('cannot open the database: connection to server at "db", port '
                               "5432 failed: Connection refused\n\tIs the server running on "
                               "that host and accepting TCP/IP connections?\r\n")

    assert run_cli("init").exit_code == 0
    monkeypatch.setattr(context, "store_for_process", unreachable)
    result = run_cli("status")
    assert result.exit_code == 3
    assert result.stderr == ('error: cannot open the database: connection to server at "db", '
                             "port 5432 failed: Connection refused; Is the server running on "
                             "that host and accepting TCP/IP connections?\n")


@pytest.mark.parametrize(("query", "named"), [
    ("?sslmode=bogus", "sslmode"), ("?target_session_attrs=zz", "target_session_attrs"),
    ("?foo=1", '"foo"'), ("?connect_timeout=x", "connect_timeout")])
@pytest.mark.parametrize("command", ["status", "init"])
def test_a_postgresql_url_whose_settings_the_driver_refuses_is_bad_input(
        query: str, named: str, command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: exit 3, "database failure", as if the server had failed. Port 1: were the
    # settings not refused before connecting, this would be an unreachable server (exit 3).
    monkeypatch.setenv("FLEET_DATABASE_URL",
                       f"postgresql+psycopg://fleet:hunter2@127.0.0.1:1/fleet{query}")
    result = run_cli(command)
    assert_refused_in_one_line(result, "FLEET_DATABASE_URL", named)
    assert "hunter2" not in result.stderr


def test_a_postgresql_port_past_65535_is_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:99999/x")
    assert_refused_in_one_line(run_cli("status"), "FLEET_DATABASE_URL", "port 99999")


@pytest.mark.parametrize("command", ["status", "init", "submit"])
def test_a_directory_named_as_the_sqlite_log_is_bad_input(
        command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "logdir").mkdir()
    monkeypatch.setenv("FLEET_DATABASE_URL", f"sqlite:///{tmp_path / 'logdir'}")
    args = [command, str(commands_file(tmp_path, "a"))] if command == "submit" else [command]
    assert_refused_in_one_line(run_cli(*args), "FLEET_DATABASE_URL", "is a directory")
    assert list((tmp_path / "logdir").iterdir()) == []


def test_an_unreachable_postgresql_is_one_line_without_its_password(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_DATABASE_URL", "postgresql+psycopg://fleet:hunter2@127.0.0.1:1/fleet")
    result = run_cli("status")
    assert result.exit_code == 3, result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, \
        result.stderr
    assert "\t" not in result.stderr and "hunter2" not in result.stderr + result.output


# 4: the Procfile's workers


def procfile_worker_args() -> list[str]:
    """The Procfile's worker command, after `fleetctl`."""
    for line in (ROOT / "Procfile").read_text().splitlines():
        name, _, command = line.partition(":")
        if name.strip() == "worker":
            program, *args = command.split()
            assert program == "fleetctl"
            return args
    raise AssertionError("the Procfile has no worker line")


def test_procfile_workers_serve_the_queue_named_by_fleet_queue(
        tmp_path: Path, embedded: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, the Procfile named --queues fleet-commands: with FLEET_QUEUE set, its workers
    # served a queue no command went to.
    monkeypatch.setenv("FLEET_QUEUE", "fleet-elsewhere")
    with EmbeddedRedisServer() as server:
        monkeypatch.setenv("FLEET_REDIS_URL", server.url)
        submitted = run_cli("submit", str(commands_file(tmp_path, "a", "b")), "--json")
        assert submitted.exit_code == 0, submitted.stderr
        environment = {**os.environ, "PYTHONPATH": str(ROOT)}
        worker = subprocess.run(
            [sys.executable, "-m", "controlplane.cli.main", *procfile_worker_args(), "--burst",
             "--json"], env=environment, capture_output=True, text=True, timeout=120,
            check=False)
    assert worker.returncode == 0, worker.stderr
    assert json.loads(worker.stdout.splitlines()[0])["queues"] == ["fleet-elsewhere"]
    store = open_store(embedded)
    assert pending_command_ids(store) == []
    store.engine.dispose()


@pytest.mark.parametrize("command", [("status",), ("log",), ("verify",), ("replay",),
                                     ("explain", "x")])
@pytest.mark.parametrize("contents", ["empty", "another program's"])
def test_a_reading_command_never_writes_a_log_into_a_database_that_holds_none(
        embedded: str, tmp_path: Path, command: tuple[str, ...], contents: str) -> None:
    """They had created the log's tables in an empty file or another program's database and
    reported an empty log (exit 0); PostgreSQL's default database got them the same way."""
    import sqlite3
    from contextlib import closing

    path = Path(embedded.removeprefix("sqlite:///"))
    path.touch()
    if contents != "empty":
        with closing(sqlite3.connect(path)) as connection:
            connection.execute("CREATE TABLE users (name TEXT)")
            connection.commit()
    before = path.read_bytes()
    result = run_cli(*command)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"error: {path} holds no fleet log (no events table)")
    assert path.read_bytes() == before


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("args", [("status",), ("log", "--json")])
def test_results_that_cannot_be_written_exit_3_in_one_line_not_a_traceback(
        embedded: str, args: tuple[str, ...]) -> None:
    """stdout on a full disk: a 27-line traceback and exit 1, which says a decision said no."""
    assert run_cli("submit", "-", input_text=json.dumps(assess_memory("a")) + "\n").exit_code == 0
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "controlplane.cli.main", *args],
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
                                cwd=ROOT, check=False)
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip().splitlines() == ["error: system error: No space left on device"]


@pytest.mark.parametrize("query", ["cache=shared", "foo=1&timeout=5"])
def test_a_sqlite_query_argument_the_driver_would_ignore_is_refused_naming_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, query: str) -> None:
    # `sqlite:///file::memory:?cache=shared` made a file called `file::memory:`, with a raw
    # two-line SQLAlchemy warning on stderr.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLEET_DATABASE_URL", f"sqlite:///file::memory:?{query}")
    result = run_cli("init")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: FLEET_DATABASE_URL passes '"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite+pysqlite://",
                                 "sqlite:///file:fleet?mode=memory&uri=true",
                                 "sqlite:///file::memory:?cache=shared&uri=true"])
def test_a_database_in_memory_is_refused_since_it_keeps_no_decision(
        embedded: str, monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """`submit` exited 0 and its decisions were gone with the process; `simulate --log` too."""
    monkeypatch.setenv("FLEET_DATABASE_URL", url)
    result = run_cli("submit", "-", input_text=json.dumps(assess_memory("a")) + "\n")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: FLEET_DATABASE_URL names a SQLite database in memory")
    monkeypatch.setenv("FLEET_DATABASE_URL", embedded)
    simulated = run_cli("simulate", str(MOONCAKE_TRACE), "--limit", "5", "--no-chart",
                        "--log", url)
    assert simulated.exit_code == 2, simulated.stderr
    assert simulated.stderr.startswith(f"error: --log {url} names a SQLite database in memory")
