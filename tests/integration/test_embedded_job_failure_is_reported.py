"""Where the decisions run in the calling process (the embedded default), a decide job that
fails is that command's failure: exit 3 naming the error. Before, `submit --wait` blamed a
timeout it never reached and `reconcile` exited 0 with the commands still undecided."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane import service
from controlplane.service import pending_command_ids
from tests.cli_helpers import run_cli
from tests.factories import assess_memory
from tests.fleet_helpers import store_at


@pytest.fixture(autouse=True)
def embedded(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    return sqlite_url


def pending_at(url: str) -> list[str]:
    with store_at(url) as store:
        return pending_command_ids(store)


def poison(*_: object, **__: object) -> None:
    raise RuntimeError("poisoned batch")




@pytest.mark.parametrize("wait", [["--wait", "--timeout", "600"], []])
def test_a_failed_decide_job_exits_3_naming_its_error_and_reconcile_says_so_too(
        tmp_path: Path, embedded: str, monkeypatch: pytest.MonkeyPatch, wait: list[str]) -> None:
    source = tmp_path / "c.jsonl"
    source.write_text(json.dumps(assess_memory("a")) + "\n", encoding="utf-8")
    monkeypatch.setattr(service, "decide_batch", poison)
    result = run_cli("submit", str(source), *wait)
    assert result.exit_code == 3, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "error: 1 decide job(s) failed here (RuntimeError: poisoned batch); their commands "
        "stay in the inbox: `fleetctl reconcile` tries them again")
    assert pending_at(embedded) == ["a"]
    assert run_cli("reconcile").exit_code == 3
    monkeypatch.undo()
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    monkeypatch.setenv("FLEET_DATABASE_URL", embedded)
    assert run_cli("reconcile").exit_code == 0
    assert pending_at(embedded) == []


def test_the_failure_is_named_by_its_type_and_first_line_not_a_footer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SQLAlchemy's messages end with the SQL and a link; the last line had been shown.
    def integrity(*_: object, **__: object) -> None:
        raise RuntimeError("UNIQUE constraint failed: events.event_id\n[SQL: INSERT INTO "
                           "events ...]\n(Background on this error at: https://sqlalche.me)")

    source = tmp_path / "c.jsonl"
    source.write_text(json.dumps(assess_memory("a")) + "\n", encoding="utf-8")
    monkeypatch.setattr(service, "decide_batch", integrity)
    result = run_cli("submit", str(source), "--wait")
    assert result.exit_code == 3
    assert result.stderr.splitlines()[-1].startswith(
        "error: 1 decide job(s) failed here (RuntimeError: UNIQUE constraint failed: "
        "events.event_id); ")
