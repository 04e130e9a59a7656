"""Subcommands that read the log: status, log, explain, verify."""

from __future__ import annotations

from typing import Any

import click

from controlplane.cli.context import existing_store
from controlplane.cli.output import emit, table
from controlplane.cli.status_view import pool_budgets, render_status
from controlplane.errors import InputError, OperationalError
from controlplane.explain import explain_id
from controlplane.replay import state_at
from controlplane.replay.boundaries import whole_decisions_cut
from events.projections import load_all
from events.verify import MAX_POSITION, parse_anchor, verify_log

json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
# Positions are stored as 64-bit signed integers; a larger one is refused as bad input.


def _utf8(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """`value` if it is text the log can hold: bytes that are not UTF-8 are a usage error."""
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise click.BadParameter("is not UTF-8 text", ctx, param) from None
    return value


@click.command()
@click.option("--at", "at_position", type=click.IntRange(min=0), default=None,
              help="Show the state as of this log position (folded from the log).")
@json_option
def status(at_position: int | None, as_json: bool) -> None:
    """Show the fleet state, live or as of a past log position."""
    store = existing_store()
    head, _ = store.head()
    cut: dict[str, int] = {}
    if at_position is None:
        with store.engine.connect() as conn:
            projections = load_all(conn)
        position = head
    else:
        # Never inside a decision: a state folded there was never committed (`whole_decisions_cut`),
        # and the report says where it moved the cut, as `replay --to` does.
        wanted = min(at_position, head)
        position = whole_decisions_cut(store, wanted)
        if position != wanted:
            cut["requested_position"] = at_position
        projections = state_at(store, position).snapshot()
    try:
        report = {"position": position, **cut, "projections": projections,
                  "pool_budgets": pool_budgets(projections)}
        shown = "" if as_json else render_status(report)
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        if at_position is not None:  # folded from the log here: not a stored row's doing
            raise
        raise OperationalError(
            f"a live projection row is not one fleetctl wrote ({type(error).__name__}: {error}): "
            "it was changed outside fleetctl; `fleetctl replay` names the rows that differ "
            "from the log, `fleetctl replay --rebuild` writes them again") from None
    emit(report, as_json, lambda _: shown)


@click.command("log")
@click.option("--stream", "stream_id", default=None, callback=_utf8, help="Only this stream.")
@click.option("--type", "event_type", default=None, callback=_utf8, help="Only this event type.")
@click.option("--command", "command_id", default=None, callback=_utf8,
              help="Only this command's events.")
@click.option("--from", "from_position", type=click.IntRange(min=0, max=MAX_POSITION), default=0,
              help="Start after this position.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@json_option
def log_command(stream_id: str | None, event_type: str | None, command_id: str | None,
                from_position: int, limit: int, as_json: bool) -> None:
    """List events, oldest first, with filters."""
    store = existing_store()
    selected = []
    for event in store.read_all(from_position=from_position):
        if stream_id and event.stream_id != stream_id:
            continue
        if event_type and event.event_type != event_type:
            continue
        if command_id and event.command_id != command_id:
            continue
        selected.append(event.as_dict())
        if len(selected) >= limit:
            break
    emit(selected, as_json, lambda rows: table(
        ["position", "stream", "type", "outcome", "command"],
        [[r["position"], r["stream_id"], r["event_type"], r["data"].get("outcome"),
          r["command_id"]] for r in rows]))


@click.command()
@click.argument("identifier", callback=_utf8)
@json_option
def explain(identifier: str, as_json: bool) -> None:
    """Explain a decision and its causation chain.

    IDENTIFIER: an event id, a command id, a stream id (replica/r1), a request, replica, rollout,
    plan, node, pool or memory id (its latest decision), or operation/TENANT/KEY (a gateway
    operation: its steps, evidence, calls and budget).
    """
    store = existing_store()
    explanation = explain_id(store, identifier)
    emit(explanation, as_json, _render_explanation)


MAX_ALTERNATIVES = 10


def _ruled_out(facts: dict[str, Any]) -> list[str]:
    """Each alternative a reason's facts say was ruled out, and by what: a placement's failure
    domains (nodes, racks) and a gateway selection's routes."""
    ruled: list[str] = []
    for domain in facts.get("domains") or []:
        if isinstance(domain, dict) and domain.get("failed") not in (None, "eligible"):
            ruled.append(f"{domain.get('domain')}: {domain['failed']} ({domain.get('gpus')} GPUs, "
                         f"{domain.get('eligible_gpus')} eligible)")
    rulings = facts.get("rulings")
    if isinstance(rulings, dict):
        ruled += [f"{route}: {ruling}" for route, ruling in rulings.items() if ruling != "eligible"]
    return ruled


def _render_explanation(report: dict[str, Any]) -> str:
    lines = []
    for step in report["chain"]:
        # An accepted command says which it is: its stream is the shared inbox.
        accepted = (f": {step['command'].get('type')} {step['command_id']}"
                    if isinstance(step.get("command"), dict) else "")
        lines.append(f"#{step['position']} {step['event_type']} on {step['stream_id']}"
                     + (f": {step['outcome']}" if step.get("outcome") else accepted))
        for reason in step.get("reasons", []):
            lines.append(f"    {reason['code']}: {reason['message']}")
            ruled = _ruled_out(reason.get("facts") or {})
            lines += [f"      ruled out {line}" for line in ruled[:MAX_ALTERNATIVES]]
            if len(ruled) > MAX_ALTERNATIVES:
                lines.append(f"      ... and {len(ruled) - MAX_ALTERNATIVES} more (--json has all)")
    if report.get("operation") is not None:
        lines += _render_operation(report["operation"])
    if report.get("awaiting_decision"):
        lines.append("    accepted, awaiting a decision (`fleetctl status` counts those waiting)")
    elif report.get("decided_at"):
        command_id = report["chain"][0]["command_id"]
        lines.append(f"    decided at #{report['decided_at'][0]} (`fleetctl explain {command_id}` "
                     "explains the decision)")
    return "\n".join(lines)


def _render_operation(explained: dict[str, Any]) -> list[str]:
    """A gateway operation's denials, steps, evidence, adapter calls and budget movements."""
    lines = [f"denied at {d['step']}: {d['code']} (#{d['position']}, {d['command_id']})"
             for d in explained["denials"]]
    operation = explained["operation"]
    if operation is None:
        return lines
    lines.append(f"operation {operation['operation_id']}: {operation['state']}"
                 + (f" ({operation['outcome_code']})"
                    if operation.get("outcome_code") not in (None, operation["state"]) else "")
                 + f"; release {operation['release_id']}, profile {operation['profile_id']}, "
                   f"route {operation['route_id']} ({operation['adapter_kind']})")
    for step in explained["steps"]:
        codes = ", ".join(step["codes"])
        lines.append(f"    step {step['step']}: {step['outcome']}" + (f" ({codes})" if codes else ""))
    for source in explained["evidence"]:
        now = ("active" if source["active_now"] else "inactive") + \
            f", now version {source['current_version']}"
        lines.append(f"    evidence {source['source_ref']} version {source['admitted_version']} "
                     f"({now})")
    adapter = explained["adapter"]
    lines.append(f"    sent to the provider {adapter['dispatch_count']} time(s)"
                 + (f", request {adapter['provider_request_id']}"
                    if adapter.get("provider_request_id") else ""))
    for move in explained["budget"]:
        lines.append(f"    budget #{move['position']} {move['event_type']}: grant "
                     f"{move['grant_units']}, committed {move['committed_units']}, released "
                     f"{move['released_units']}")
    return lines


@click.command()
@click.option("--anchor", default=None, metavar="POSITION:HASH",
              help="A head printed by an earlier verify, kept outside the database: the row at "
                   "POSITION must still carry HASH.")
@json_option
def verify(anchor: str | None, as_json: bool) -> int:
    """Verify the hash chain; exit 1 and name the first bad position if it is broken.

    Prints the head as POSITION:HASH: keep it outside the database and pass it back with
    --anchor, and a rewrite of the log up to it is found even if the whole chain was redone.
    """
    try:
        anchored = parse_anchor(anchor) if anchor is not None else None
    except ValueError as error:
        raise InputError(str(error)) from None
    store = existing_store()
    report = verify_log(store, anchored)
    # An empty log has no head to keep: an anchor names an event (position 1 or later).
    emit({**report.__dict__, "head": f"{report.head_position}:{report.head_hash}"
          if report.head_hash and report.head_position else None,
          "anchor": f"{anchored[0]}:{anchored[1]}" if anchored else None}, as_json,
         lambda r: (f"chain intact: {r['events_checked']} events verified; "
                    + (f"head {r['head']}" if r["head"] else "the log is empty: no head to anchor")
                    + (f" (anchored at {r['anchor'].split(':')[0]})" if r["anchor"] else ""))
         if r["ok"] else
         f"chain BROKEN at position {r['first_bad_position']}: {r['problem']} ({r['detail']})")
    return 0 if report.ok else 1
