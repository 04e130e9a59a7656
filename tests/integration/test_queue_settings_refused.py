"""A queue name or Redis URL that cannot work is refused (exit 2, naming the variable) before
anything is written: before, `FLEET_QUEUE=fleet.prod` failed with a traceback after the inbox
was written, and `redis://host/abc` silently used database 0."""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from redis.connection import parse_url
from redis.exceptions import OutOfMemoryError

import workers.pipeline
from controlplane.errors import InputError
from controlplane.runtime import open_store
from controlplane.settings import Settings, checked_redis_url
from tests.cli_helpers import run_cli
from tests.factories import assess_memory


@pytest.fixture
def commands(tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    monkeypatch.delenv("FLEET_QUEUE", raising=False)
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(assess_memory("a")) + "\n")
    return path


def database_file(tmp_path: Path) -> Path:
    return tmp_path / "fleet.db"


def events_in(path: Path) -> int:
    with closing(sqlite3.connect(path)) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        return connection.execute("SELECT count(*) FROM events").fetchone()[0] \
            if "events" in tables else 0


def assert_refused_naming(result: object, variable: str) -> None:
    assert result.exit_code == 2, result.stderr  # type: ignore[attr-defined]
    stderr: str = result.stderr  # type: ignore[attr-defined]
    assert stderr.startswith(f"error: {variable}") and len(stderr.splitlines()) == 1, stderr


@pytest.mark.parametrize("name", ["fleet.prod", "a b", "q" * 101, "fleet:prod", "café"])
def test_a_queue_name_rq_cannot_use_is_refused_before_the_log_is_created(
        name: str, commands: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_QUEUE", name)
    for args in (["submit", str(commands)], ["reconcile"], ["status"]):
        assert_refused_naming(run_cli(*args), "FLEET_QUEUE")
    assert not database_file(tmp_path).exists()


def test_a_queue_name_of_letters_digits_dashes_and_underscores_is_served(
        commands: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_QUEUE", "Fleet_prod-2")
    result = run_cli("submit", str(commands), "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.output)["decisions"][0]["outcome"] == "fits"


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/abc", "redis://127.0.0.1:6379/-1",
                                 "redis://127.0.0.1:6379/0?db=x", "redis://127.0.0.1:port/0",
                                 "redis://127.0.0.1:70000/0", "http://127.0.0.1:6379/0",
                                 "notaurl", "redis://127.0.0.1:6379/2147483648",
                                 # options redis-py refuses only when it builds a connection:
                                 # before, the inbox was written and Redis called unreachable
                                 "rediss://127.0.0.1:6379/0?ssl_cert_reqs=bogus",
                                 "redis://127.0.0.1:6379/0?foo=1",
                                 "redis://127.0.0.1:6379/0?protocol=9",
                                 "redis://127.0.0.1:6379/0?socket_timeout=abc",
                                 # two indexes: redis-py used the query's, we named the path's
                                 "redis://127.0.0.1:6379/11?db=12"])
def test_a_redis_url_redis_py_would_misread_is_refused_before_the_log_is_created(
        url: str, commands: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_REDIS_URL", url)
    for args in (["submit", str(commands)], ["reconcile"], ["worker", "--burst"]):
        assert_refused_naming(run_cli(*args), "FLEET_REDIS_URL")
    assert not database_file(tmp_path).exists()


@pytest.mark.parametrize("url, db", [("redis://h:6379/0", 0), ("redis://h", 0),
                                     ("redis://h/", 0), ("rediss://u:p@h:1/3", 3),
                                     ("redis://h?db=4", 4), ("unix:///tmp/r.sock?db=2", 2),
                                     ("redis://h/5?db=5", 5)])
def test_every_redis_url_form_redis_py_reads_as_written_is_accepted(url: str, db: int) -> None:
    assert checked_redis_url(url) == url
    assert parse_url(url).get("db", 0) == db  # the index we let through is the one used


def test_the_refusal_names_no_password() -> None:
    with pytest.raises(InputError) as refused:
        checked_redis_url("http://user:s3cret@h:1/0")
    assert "s3cret" not in str(refused.value)


def test_a_refused_connection_option_names_no_password() -> None:
    with pytest.raises(InputError) as refused:
        checked_redis_url("redis://user:s3cret@h:1/0?foo=s3cret")
    assert "s3cret" not in str(refused.value)


def test_settings_read_the_validated_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_REDIS_URL", "redis://h:1/7")
    assert Settings.from_env().redis_url == "redis://h:1/7"


def test_a_database_index_the_server_does_not_have_is_refused_before_the_inbox_is_written(
        commands: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, the commands were recorded and the refusal read as an outage (exit 3).
    real = os.environ.get("FLEET_TEST_REDIS_URL")
    if not real:
        pytest.skip("FLEET_TEST_REDIS_URL is not set")
    options = parse_url(real)
    monkeypatch.setenv("FLEET_REDIS_URL",
                       f"redis://{options.get('host', '127.0.0.1')}:{options.get('port', 6379)}"
                       f"/{2**31 - 1}")
    result = run_cli("submit", str(commands))
    assert_refused_naming(result, "FLEET_REDIS_URL")
    assert "out of range" in result.stderr
    store = open_store(sqlite_url)
    try:
        assert store.head()[0] == 0
    finally:
        store.engine.dispose()


@pytest.mark.parametrize("variable", ["FLEET_BATCH_SIZE", "FLEET_JOB_TIMEOUT_SECONDS"])
@pytest.mark.parametrize("raw", ["١٠", " 5", "5 ", "+5", "1_0", "--5", "5.0"])
def test_a_number_setting_takes_ascii_digits_as_written_only(
        variable: str, raw: str, commands: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, int() read Arabic-Indic digits, spaces, a sign and underscores.
    monkeypatch.setenv(variable, raw)
    assert_refused_naming(run_cli("submit", str(commands)), variable)
    assert not database_file(tmp_path).exists()


def test_a_sqlite_log_in_a_directory_that_does_not_exist_is_bad_input_not_an_outage(
        commands: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, exit 3 with SQLite's "unable to open database file", naming nothing.
    monkeypatch.setenv("FLEET_DATABASE_URL", f"sqlite:///{tmp_path / 'nodir' / 'x.db'}")
    result = run_cli("submit", str(commands))
    assert_refused_naming(result, "FLEET_DATABASE_URL")
    assert str(tmp_path / "nodir") in result.stderr
    assert not (tmp_path / "nodir").exists()


def test_an_unreachable_tls_redis_is_named_with_its_scheme(
        commands: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_REDIS_URL", "rediss://user:s3cret@127.0.0.1:1/3")
    result = run_cli("reconcile")
    assert result.exit_code == 3
    assert result.stderr.startswith("error: Redis at rediss://127.0.0.1:1/3 is unreachable")
    assert "s3cret" not in result.stderr


@pytest.mark.parametrize("name", ["bad name", "fleet.prod"])
def test_a_worker_queue_option_rq_cannot_use_is_refused_naming_the_option(
        name: str, commands: Path, tmp_path: Path) -> None:
    # Before, `worker --burst --queues 'bad name'` exited 0 having served nothing.
    result = run_cli("worker", "--burst", "--queues", "fleet-commands", "--queues", name)
    assert result.exit_code == 2, result.stderr
    assert "--queues" in result.stderr and repr(name) in result.stderr, result.stderr
    assert not database_file(tmp_path).exists()


def test_a_submit_to_an_unreachable_redis_says_its_commands_wait_in_the_inbox(
        commands: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inbox is written before the queue is reached: the operator is told, and how the
    commands are enqueued later (they had been left in the inbox without a word)."""
    monkeypatch.setenv("FLEET_REDIS_URL", "redis://127.0.0.1:1/3")
    result = run_cli("submit", str(commands))
    assert result.exit_code == 3
    assert result.stderr.startswith("error: Redis at redis://127.0.0.1:1/3 is unreachable")
    assert "command(s) are recorded in the inbox, undecided" in result.stderr
    assert "`fleetctl reconcile`" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_redis_that_answers_then_refuses_the_enqueue_says_the_commands_wait_in_the_inbox(
        commands: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: "Redis failure: OutOfMemoryError", not a word about the recorded commands.
    def refused(*_: object, **__: object) -> list[str]:
        raise OutOfMemoryError("command not allowed when used memory > 'maxmemory'")

    monkeypatch.setattr(workers.pipeline, "enqueue_commands", refused)
    result = run_cli("submit", str(commands))
    assert result.exit_code == 3
    assert result.stderr.startswith("error: Redis failure: OutOfMemoryError: command not allowed")
    assert "1 command(s) are recorded in the inbox, undecided" in result.stderr
    assert events_in(database_file(tmp_path)) == 1


@pytest.mark.parametrize("command", [("worker", "--burst"), ("up", "--workers", "0"),
                                     ("submit", "COMMANDS"), ("reconcile",)])
def test_a_process_that_would_decide_without_the_catalog_refuses_to_start(
        command: tuple[str, ...], commands: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Started anyway, a worker (or `submit` and `reconcile` deciding on the embedded queue)
    would record each RegisterModel by catalog id it decided as rejected
    (`catalog_unreadable`) for good: a fault of its own machine. Nothing is accepted."""
    monkeypatch.setenv("FLEET_FIXTURES_DIR", str(tmp_path / "nowhere"))
    result = run_cli(*(str(commands) if part == "COMMANDS" else part for part in command))
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"error: FLEET_FIXTURES_DIR: the catalog in "
                                    f"{tmp_path / 'nowhere'} cannot be read")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not database_file(tmp_path).exists() or events_in(database_file(tmp_path)) == 0


@pytest.mark.parametrize("command", [("worker", "--burst"), ("up", "--workers", "0"),
                                     ("submit", "COMMANDS"), ("reconcile",)])
def test_a_process_that_would_decide_with_an_unusable_gateway_fixture_dir_refuses_to_start(
        command: tuple[str, ...], commands: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Started anyway, every `Dispatch` it decided found no provider to call."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("FLEET_GATEWAY_FIXTURE_DIR", str(blocker / "provider"))
    result = run_cli(*(str(commands) if part == "COMMANDS" else part for part in command))
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"error: FLEET_GATEWAY_FIXTURE_DIR: {blocker / 'provider'} "
                                    "cannot be used as a directory (Not a directory)"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not database_file(tmp_path).exists() or events_in(database_file(tmp_path)) == 0


def test_up_with_a_redis_url_set_is_refused_since_submits_would_go_there(
        commands: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`up` serves a Redis of its own; it had started and said "`fleetctl submit` here
    reaches them" while submits from that shell went to FLEET_REDIS_URL's."""
    monkeypatch.setenv("FLEET_REDIS_URL", "redis://user:s3cret@127.0.0.1:1/3")
    result = run_cli("up", "--workers", "0")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: FLEET_REDIS_URL is set (redis://")
    assert "s3cret" not in result.stderr and "`fleetctl worker`" in result.stderr
