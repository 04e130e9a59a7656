"""`fleetctl plan SCENARIO.json`: the fleet plan of spec §2 decided through the queue.

Every stage is a command decided by the workers and appended to the log; the plan written to
`--output` is assembled from those decision events alone. The plan id is the scenario's digest,
so planning the same scenario again finds the recorded decisions and writes the same bytes.
Exit codes: 0 release-ready, 1 not release-ready, 2 a bad scenario (nothing is written),
3 a store or queue failure, a refused stage or a timeout.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from controlplane.cli.context import WAIT_SECONDS, settings_and_store
from controlplane.cli.output import table
from controlplane.commands.plan import PlanFleet
from controlplane.decisions import REJECTED
from controlplane.errors import InputError, OperationalError
from controlplane.files import check_writable, read_json
from controlplane.policies.fleet_plan import (
    plan_from_results,
    plan_to_plain,
    scenario_digest,
    scenario_from_plain,
)
from controlplane.policies.fleet_plan_scenario import MAX_SCENARIO_BYTES
from controlplane.policies.reasons import PolicyInputError, to_plain
from controlplane.settings import Settings
from controlplane.state.plan import EVENT_STAGES, FLEET_PLAN_STARTED, plan_stream
from events.model import RecordedEvent
from events.store import EventStore
from workers.pipeline import WORKERS_HINT, reconcile, submit

EXIT_READY, EXIT_NOT_READY = 0, 1
# Only a guard on what is read: the limit that counts, MAX_SCENARIO_BYTES of canonical JSON, is
# checked on the parsed scenario (`scenario_from_plain`), since indentation, escapes and number
# spellings make a file's size say little about it. The room is for a generously indented file.
MAX_SCENARIO_FILE_BYTES = 16 * MAX_SCENARIO_BYTES


def plan_command_id(plan_id: str) -> str:
    """The command id `fleetctl plan` gives a plan: one per scenario digest."""
    return f"plan-{plan_id}"


def _read_scenario(path: str) -> object:
    return read_json(Path(path), MAX_SCENARIO_FILE_BYTES)


def _settled(events: list[RecordedEvent], plan_command: str) -> bool:
    """True once graded; OperationalError if the plan or one of its own stages was refused."""
    started = next((e for e in events if e.event_type == FLEET_PLAN_STARTED), None)
    chain = {plan_command} if started is None else set(
        started.data["result"]["stage_command_ids"].values())
    for event in events:
        if event.event_type == REJECTED and event.command_id in chain:
            (reason, *_) = event.data["reasons"]
            raise OperationalError(f"the plan's command {event.command_id} was refused: "
                                   f"{reason['code']}: {reason['message']}")
    return any(EVENT_STAGES.get(e.event_type) == "grade" for e in events)


def decide_plan(settings: Settings, store: EventStore, scenario: dict[str, Any], plan_id: str,
                timeout_seconds: float) -> list[RecordedEvent]:
    """Submit the plan (unless already recorded) and wait for its grade, at most
    `timeout_seconds` (on the embedded queue the stages run here, and stop after the one in
    hand at the deadline: the rest stay in the inbox); its stream's events."""
    command_id = plan_command_id(plan_id)
    stream = plan_stream(plan_id)
    deadline = time.monotonic() + timeout_seconds
    hint = WORKERS_HINT
    events = store.read_stream(stream)
    if not _settled(events, command_id):
        submitted = submit(settings, store, [PlanFleet(command_id=command_id, plan_id=plan_id,
                                                       scenario=scenario)], deadline=deadline)
        events = store.read_stream(stream)
        if submitted.ran_in_process and not _settled(events, command_id):
            # Embedded queue: an earlier process may have stopped mid-chain; finish it here.
            reconcile(settings, store, deadline)
        if submitted.ran_in_process:
            hint, deadline = "its remaining stages stay in the inbox: run the same plan again " \
                "(or `fleetctl reconcile`) to finish them", 0.0  # nothing else will decide them
    delay = 0.02
    while not _settled(events := store.read_stream(stream), command_id):
        if time.monotonic() > deadline:
            raise OperationalError(f"plan {plan_id} is not graded after {timeout_seconds:g}s; "
                                   f"{hint}")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    return events


def _summary(report: dict[str, Any], events: list[RecordedEvent], output: str) -> str:
    verdict = "RELEASE READY" if report["release_ready"] else "NOT RELEASE READY"
    rows = [[EVENT_STAGES[e.event_type], e.data["outcome"],
             ", ".join(r["code"] for r in e.data["reasons"])]
            for e in events if e.event_type in EVENT_STAGES]
    lines = [f"plan {report['scenario_name']}: {verdict}",
             f"inputs digest {report['inputs_digest']}", "",
             table(["stage", "outcome", "reasons"], rows), ""]
    lines += [f"violation {v['code']}: {v['message']}" for v in report["violations"]]
    lines.append(f"wrote {output}")
    return "\n".join(lines)


@click.command("plan")
@click.argument("scenario_path", metavar="SCENARIO.json")
@click.option("--output", default="fleet-plan.json", show_default=True,
              help="Where to write the plan JSON.")
@click.option("--timeout", "timeout_seconds", type=WAIT_SECONDS, default=60.0, show_default=True,
              help="Seconds to wait for the workers' decisions before giving up (exit 3).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan JSON instead of a summary.")
@click.pass_context
def plan(ctx: click.Context, scenario_path: str, output: str, timeout_seconds: float,
         as_json: bool) -> None:
    """Plan the fleet for SCENARIO.json: every stage is a command decided by the workers.

    Exit 0 when the plan is release-ready, 1 when it is not, 2 for a bad scenario.
    """
    try:
        scenario = scenario_from_plain(_read_scenario(scenario_path))
    except PolicyInputError as error:
        if as_json:
            click.echo(json.dumps({"error": error.as_dict()}, indent=2))
        raise InputError(f"{scenario_path}: {error.field}: {error.message} [{error.code}]"
                         ) from None
    check_writable(Path(output), "--output")  # before the plan is submitted, not after
    plan_id = scenario_digest(scenario)
    settings, store = settings_and_store()
    events = decide_plan(settings, store, to_plain(scenario), plan_id, timeout_seconds)
    results = {EVENT_STAGES[e.event_type]: e.data["result"] for e in events
               if e.event_type in EVENT_STAGES}
    report = plan_to_plain(plan_from_results(results))
    text = json.dumps(report, indent=2) + "\n"
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as error:  # after the plan was decided: the machine's fault, not the input's
        raise OperationalError(f"cannot write {output}: {error.strerror}; the plan is recorded "
                               f"(plan {plan_id}): run plan again to write it") from None
    click.echo(text if as_json else _summary(report, events, output), nl=not as_json)
    ctx.exit(EXIT_READY if report["release_ready"] else EXIT_NOT_READY)
