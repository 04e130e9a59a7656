"""A submission cannot take an id the control plane gives the commands its decisions issue, and a
time UTC cannot hold is refused naming its field: both used to get past submit and then fail
(a batch that could never commit; a traceback, exit 1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controlplane.commands.plan import stage_command_ids
from controlplane.decisions import is_issued_id
from tests.cli_helpers import run_cli
from tests.factories import assess_memory, register_node
from tests.fleet_helpers import log_size


@pytest.fixture(autouse=True)
def embedded(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    return sqlite_url


def submit(tmp_path: Path, *payloads: dict[str, Any]) -> Any:
    source = tmp_path / "c.jsonl"
    source.write_text("\n".join(json.dumps(p) for p in payloads), encoding="utf-8")
    return run_cli("submit", str(source), "--wait", "--timeout", "30")




def test_every_id_a_plan_issues_has_the_reserved_form() -> None:
    # Before, a RegisterNode under `p1:capacity` made PlanFleet `p1` collide at commit.
    assert all(is_issued_id(command_id) for command_id in stage_command_ids("p1").values())
    assert all(is_issued_id(c) for c in stage_command_ids("p" * 100).values())  # digest form


@pytest.mark.parametrize("command_id", ["o1:place:1", "o1:place:12", "meas1:evaluate",
                                        "0123456789abcdef01234567:place:3", "p1:capacity",
                                        "plan-0a1b:grade"])
def test_an_id_of_the_form_decisions_issue_is_refused_at_submit_and_nothing_is_written(
        tmp_path: Path, embedded: str, command_id: str) -> None:
    node = {**register_node("n9"), "command_id": command_id}
    result = submit(tmp_path, assess_memory("fine"), node)
    assert result.exit_code == 2, result.stderr
    assert f"line 2: command_id: command id {command_id!r} has the form" in result.stderr
    assert log_size(embedded) == 0


@pytest.mark.parametrize("command_id", ["o1:place", "o1:place:x", "evaluate", "m:evaluated",
                                        "o1:placed:1", "capacity", "p1:capacities"])
def test_ids_merely_like_the_issued_forms_are_accepted(
        tmp_path: Path, command_id: str) -> None:
    assert not is_issued_id(command_id)
    result = submit(tmp_path, {**register_node("n9"), "command_id": command_id})
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize(("field", "value"), [("at", "0001-01-01T00:00:00+01:00"),
                                              ("at", "9999-12-31T23:00:00-05:00")])
def test_a_time_utc_cannot_hold_is_refused_naming_its_field(
        tmp_path: Path, embedded: str, field: str, value: str) -> None:
    result = submit(tmp_path, {**assess_memory("a"), field: value})
    assert result.exit_code == 2, result.stderr
    assert f"line 1: {field}: " in result.stderr and "years 1 to 9999" in result.stderr
    assert "Traceback" not in result.stderr
    assert log_size(embedded) == 0


def test_a_request_deadline_utc_cannot_hold_is_refused_naming_it(tmp_path: Path) -> None:
    request = {"type": "AdmitRequest", "command_id": "q1", "request_id": "q1", "pool_id": "p",
               "prompt_tokens": 10, "max_output_tokens": 10,
               "deadline_at": "9999-12-31T23:00:00-05:00"}
    result = submit(tmp_path, request)
    assert result.exit_code == 2, result.stderr
    assert "deadline_at: " in result.stderr and "years 1 to 9999" in result.stderr
