"""The fuzz tests' fleet: an embedded control plane (temporary SQLite, in-process fake Redis) with a
seeded world, and the one property every input must satisfy there.

The property: a submission is either refused with a typed error (`SubmissionRejected` naming a
line and a field for each problem, or `InputError`) and the log's head does not move, or it is
accepted and every accepted command has a recorded decision (an event carrying an `outcome`,
possibly "rejected" or "denied").
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from controlplane.commands import CommandBase, parse_command
from controlplane.decisions import ACCEPTED
from controlplane.errors import FieldProblem, InputError, SubmissionRejected
from controlplane.gateway.fixture_provider import FIXTURE_DIR_ENV
from controlplane.gateway.scenario import common_fixture
from controlplane.runtime import open_store
from controlplane.settings import Settings
from controlplane.submission import read_submission
from events.store import EventStore
from tests.factories import assess_memory, place_replica, register_model, register_node
from workers.connections import connect
from workers.pipeline import submit

AT = "2026-11-30T12:00:00Z"


def seed_commands() -> list[CommandBase]:
    """Nodes, a model, a pool with a replica, a request, a rollout, and the gateway's fixture."""
    fleet = [
        register_node("n1"), register_node("n2", rack="rack-1"), register_model("llama-8b"),
        place_replica("r1"), assess_memory("seed-memory"),
        {"type": "AdmitRequest", "command_id": "seed-admit", "at": AT, "request_id": "req-1",
         "pool_id": "chat", "prompt_tokens": 100, "max_output_tokens": 100,
         "deadline_at": "2026-11-30T12:01:00Z"},
        {"type": "StartRollout", "command_id": "seed-rollout", "at": AT, "rollout_id": "ro-1",
         "pool_id": "chat", "baseline_revision": "v1", "candidate_revision": "v2"},
    ]
    return [parse_command(payload) for payload in fleet] + common_fixture()


@contextmanager
def embedded_fleet(directory: Path) -> Iterator[EventStore]:
    """An embedded control plane on a fresh SQLite file in `directory`, seeded with a world."""
    with pytest.MonkeyPatch.context() as patch:
        url = f"sqlite:///{directory}/fleet.db"
        patch.setenv("FLEET_DATABASE_URL", url)
        patch.delenv("FLEET_REDIS_URL", raising=False)
        patch.setenv("FLEET_QUEUE", "fleet-fuzz")
        patch.setenv(FIXTURE_DIR_ENV, str(directory / "provider"))
        store = open_store(url)
        seeds = seed_commands()
        submit(Settings.from_env(), store, seeds)
        undecided = [c.command_id for c in seeds if not decisions_of(store, [c.command_id])[c.command_id]]
        assert not undecided, f"the seeded world left commands undecided: {undecided}"
        yield store
        store.engine.dispose()


def decisions_of(store: EventStore, command_ids: Sequence[str]) -> dict[str, list[str]]:
    """Each command's recorded outcomes (events that carry one), by command id."""
    by_command = store.events_for_commands(list(command_ids))
    return {command_id: [str(e.data["outcome"]) for e in events
                         if e.event_type != ACCEPTED and "outcome" in e.data]
            for command_id, events in by_command.items()}


def job_failures(job_ids: Sequence[str]) -> str:
    """Why the jobs did not finish, for an assertion message."""
    connection = connect(Settings.from_env())
    lines = []
    for job_id in job_ids:
        job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
        result = job.latest_result()
        lines.append(f"{job_id}: {job.get_status()}: {getattr(result, 'exc_string', None)}")
    return "\n".join(lines)


@dataclass
class Verdict:
    """How a submission ended: refused (where, and the problems) or decided (the outcomes)."""

    stage: str  # "parse", "precheck" or "decided"
    problems: list[FieldProblem] = field(default_factory=list)
    outcomes: dict[str, list[str]] = field(default_factory=dict)


def assert_problems_name_lines_and_fields(problems: Sequence[FieldProblem], lines: Sequence[int]) -> None:
    assert problems, "a refusal lists at least one problem"
    for problem in problems:
        assert problem.line in lines, f"{problem} names no line of the submission {list(lines)}"
        assert isinstance(problem.field, str) and problem.field.strip(), f"{problem} names no field"


def decide_or_refuse(store: EventStore, text: str) -> Verdict:
    """Run `text` through `read_submission` then `submit`, and check the property above."""
    head = store.head()
    line_count = max(1, len(text.splitlines()))
    try:
        submission = read_submission(text)
    except SubmissionRejected as refusal:
        assert_problems_name_lines_and_fields(refusal.problems, range(1, line_count + 1))
        assert store.head() == head, "a refusal wrote to the log"
        return Verdict("parse", refusal.problems)
    except InputError:
        assert store.head() == head, "a refusal wrote to the log"
        return Verdict("parse")
    try:
        result = submit(Settings.from_env(), store, submission.commands, submission.lines)
    except SubmissionRejected as refusal:
        assert_problems_name_lines_and_fields(refusal.problems, submission.lines)
        assert store.head() == head, "a refused submission wrote to the log"
        return Verdict("precheck", refusal.problems)
    ids = list(dict.fromkeys(c.command_id for c in submission.commands))
    outcomes = decisions_of(store, ids)
    undecided = [command_id for command_id, found in outcomes.items() if not found]
    assert not undecided, (f"accepted but never decided: {undecided}\n{job_failures(result.job_ids)}\n"
                           f"submission: {text[:2_000]}")
    return Verdict("decided", outcomes=outcomes)


_serial = itertools.count()


def fresh_ids(payloads: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The payloads with command ids never used before in this process.

    A command id already in the inbox names the command recorded under it (a re-submission is
    skipped), so fuzzed ids that repeat would hide the new command behind the old decision.
    """
    return [{**payload, "command_id": f"fz{next(_serial)}-{payload.get('command_id', 'x')}"[:100]}
            for payload in payloads]
