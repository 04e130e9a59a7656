"""`fleetctl simulate` checks every option before its log is created or touched: a refused run
exits 2 with one line naming the option, and leaves no log file (nor an old one changed)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from controlplane.simulation.config import MAX_REPLICAS
from tests.cli_helpers import run_cli

TRACE = Path(__file__).resolve().parents[2] / "fixtures" / "traces" / "AzureLLMInferenceTrace_conv.csv"
SMALL = ["--limit", "3", "--no-chart", "--no-rollout"]


def _simulate(log: str | Path, *options: str) -> tuple[int, str]:
    outcome = run_cli("simulate", str(TRACE), *SMALL, *options, "--log", str(log))
    assert "Traceback" not in outcome.stderr
    return outcome.exit_code, outcome.stderr


def _no_log(log: Path) -> bool:
    return not any(Path(f"{log}{suffix}").exists() for suffix in ("", "-wal", "-shm"))


@pytest.mark.parametrize(("named", "options"), [
    ("--max-replicas", ["--max-replicas", str(MAX_REPLICAS + 1)]),
    ("--max-replicas", ["--max-replicas", str(10 ** 12)]),  # hung registering nodes
    ("--replicas", ["--replicas", str(MAX_REPLICAS + 1), "--max-replicas", str(MAX_REPLICAS)]),
    ("--min-replicas", ["--min-replicas", str(MAX_REPLICAS + 1)]),
    ("--replicas", ["--replicas", "9", "--max-replicas", "8"]),
    ("--min-replicas", ["--min-replicas", "3", "--max-replicas", "2"]),
    ("--speedup", ["--speedup", "nan"]),
    ("--control-interval", ["--control-interval", "nan"]),
    ("--warmup-seconds", ["--warmup-seconds", "nan"]),
    ("--deadline-seconds", ["--deadline-seconds", "nan"]),
    ("--deadline-seconds", ["--deadline-seconds", "86401"]),
])
def test_an_option_out_of_bounds_exits_2_naming_it_and_leaves_no_log(
        tmp_path: Path, named: str, options: list[str]) -> None:
    log = tmp_path / "sim.db"
    exit_code, stderr = _simulate(log, *options)
    assert exit_code == 2 and named in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert _no_log(log)


def test_max_replicas_at_its_bound_is_a_fleet_the_control_plane_accepts(tmp_path: Path) -> None:
    """The bound is no tighter than the control plane: the autoscaling policy set to it, and
    the nodes for it registered, the run completes."""
    log = tmp_path / "sim.db"
    exit_code, stderr = _simulate(log, "--max-replicas", str(MAX_REPLICAS))
    assert exit_code == 0, stderr


def test_a_gpu_the_engines_cannot_be_costed_on_exits_2_and_leaves_no_log(tmp_path: Path) -> None:
    log = tmp_path / "sim.db"
    exit_code, stderr = _simulate(log, "--gpu", "A10G")  # no dense bf16 figure in the catalog
    assert exit_code == 2 and "--gpu" in stderr and "A10G" in stderr, stderr
    assert _no_log(log)


def test_a_catalog_it_cannot_read_is_blamed_on_the_fixtures_variable_and_leaves_no_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It printed "--/nowhere/catalog/models.json: ..." as if that were an option.
    monkeypatch.setenv("FLEET_FIXTURES_DIR", str(tmp_path / "nowhere"))
    code, stderr = _simulate(tmp_path / "run.db")
    assert code == 2 and stderr.startswith("error: FLEET_FIXTURES_DIR: cannot read catalog file")
    assert _no_log(tmp_path / "run.db")


def test_a_refused_run_with_overwrite_leaves_the_old_log_as_it_was(tmp_path: Path) -> None:
    log = tmp_path / "sim.db"
    log.write_bytes(b"an earlier run's log")
    exit_code, stderr = _simulate(log, "--overwrite", "--gpu", "A10G")
    assert exit_code == 2 and "--gpu" in stderr, stderr
    assert log.read_bytes() == b"an earlier run's log"


@pytest.mark.parametrize("form", ["url", "relative-url"])
def test_a_sqlite_url_log_in_a_missing_directory_exits_2_naming_log_and_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    missing = tmp_path / "missing"
    if form == "url":
        url = f"sqlite:///{missing / 'sim.db'}"
    else:
        monkeypatch.chdir(tmp_path)
        url = "sqlite:///missing/sim.db"
    exit_code, stderr = _simulate(url, "--no-autoscale")
    assert exit_code == 2 and "--log" in stderr and "missing" in stderr, stderr
    assert not missing.exists()


def test_a_log_path_ending_in_a_separator_exits_2_and_creates_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    exit_code, stderr = _simulate("missing/", "--no-autoscale")
    assert exit_code == 2 and "--log" in stderr, stderr
    assert list(tmp_path.iterdir()) == []


def test_a_database_url_holding_other_tables_is_refused_and_left_as_it_was(
        tmp_path: Path) -> None:
    # Before, the log's schema was created in it first, and only then were its events counted.
    other = tmp_path / "shop.db"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE customers (id INTEGER)")
    exit_code, stderr = _simulate(f"sqlite:///{other}")
    assert exit_code == 2 and "--log" in stderr and "customers" in stderr, stderr
    with sqlite3.connect(other) as connection:
        tables = connection.execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("customers",)]


def test_a_database_url_that_already_holds_a_run_is_refused_and_an_empty_one_is_used(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    assert _simulate(url)[0] == 0
    exit_code, stderr = _simulate(url)
    assert exit_code == 2 and "already holds events" in stderr, stderr


def test_overwrite_replaces_a_log_named_by_sqlite_url(tmp_path: Path) -> None:
    # Before, --overwrite was ignored for a URL: the second run was refused as a log that
    # already holds events.
    url = f"sqlite:///{tmp_path / 'sim.db'}"

    def events() -> int:
        with closing(sqlite3.connect(tmp_path / "sim.db")) as connection:
            return int(connection.execute("SELECT count(*) FROM events").fetchone()[0])

    assert _simulate(url)[0] == 0
    first = events()
    exit_code, stderr = _simulate(url, "--overwrite")
    assert exit_code == 0, stderr
    assert events() == first > 0  # the same run again, in a log of its own


def test_overwrite_never_empties_a_database_named_by_postgresql_url(tmp_path: Path) -> None:
    exit_code, stderr = _simulate("postgresql+psycopg://fleet:hunter2@127.0.0.1:1/fleet",
                                  "--overwrite")
    assert exit_code == 2 and "--overwrite" in stderr and "never emptied" in stderr, stderr
    assert "hunter2" not in stderr


def test_a_trace_that_is_not_a_regular_file_is_named_as_such(tmp_path: Path) -> None:
    outcome = run_cli("simulate", "/dev/null", *SMALL, "--log", str(tmp_path / "s.db"))
    assert outcome.exit_code == 2
    assert "not a regular file" in outcome.stderr and "no such" not in outcome.stderr
    assert _no_log(tmp_path / "s.db")
