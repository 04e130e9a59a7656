"""`fleetctl replay`: rebuild projections, re-derive decisions, or ask what-if."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from controlplane.cli.context import existing_store
from controlplane.cli.output import emit, progress
from controlplane.cli.status_view import pool_budgets, render_status
from controlplane.policy_book import PolicyBook, load_overrides
from controlplane.replay import compare_with_live, state_at
from controlplane.replay.boundaries import whole_decisions_cut
from controlplane.replay.rebuild import rebuild_live
from controlplane.replay.verify import verify_decisions


def _render(report: dict[str, Any]) -> str:
    lines = []
    if "rebuilt_events" in report:
        lines.append(f"rebuilt the live projections from {report['rebuilt_events']} event(s)")
        repaired = report["repaired_differences"]
        if repaired:
            lines.append(f"  the live state differed from the log before the rebuild: "
                         f"{report['differences_repaired']} row(s) rewritten "
                         f"({_rows(repaired, report['differences_repaired'])})")
    if "state" in report:
        where: dict[str, Any] = {key: report[key] for key in ("position", "requested_position")
                                 if key in report}
        lines.append(render_status({**where, "projections": report["state"],
                                    "pool_budgets": pool_budgets(report["state"])}))
    if "projection_differences" in report:
        differences = report["projection_differences"]
        lines.append("projections: rebuilt state equals the live state" if not differences
                     else f"projections: {len(differences)} difference(s) from the live state "
                     f"({_rows(differences, len(differences))}; --json shows both values)")
    if "decisions_checked" in report:
        drifts = report["drifts"]
        label = "what-if" if report.get("what_if") else "verify"
        changed: list[dict[str, Any]] = []
        same: list[dict[str, Any]] = []
        for drift in drifts:
            outcome_changed = drift["recorded"]["outcome"] != drift["rederived"]["outcome"]
            (changed if outcome_changed else same).append(drift)
        lines.append(f"{label}: {report['decisions_checked']} decision(s) re-derived, "
                     f"{'identical' if not drifts else f'{len(drifts)} would differ'}"
                     f"{f' ({len(changed)} in outcome)' if drifts else ''}")
        older = [d for d in drifts if d["older_rules"]]
        if older and not report.get("what_if"):
            lines.append(f"  {len(older)} of them decided under older rules than today's "
                         "(an upgrade changed them; see the CHANGELOG), "
                         f"{len(drifts) - len(older)} under today's")
        elif older:  # re-derived under today's rules: the upgrade may be what differs
            lines.append(f"  {len(older)} of them decided under older rules than today's: "
                         "they may differ by the upgrade, not the what-if (plain `replay "
                         "--verify` lists what the upgrade alone changes)")
        refused = [d for d in drifts if d.get("refused_today")]
        if refused:
            lines.append(f"  {len(refused)} of them of commands today's validation refuses as "
                         "recorded (an upgrade tightened it; re-derived, they are rejected)")
        if report.get("decisions_unchecked"):
            lines.append(f"  {report['decisions_unchecked']} decision(s) left unchecked: their"
                         " events run past position "
                         f"{report.get('requested_position', report['position'])}")
        # Changed outcomes first: the rest differ only in their reasons' facts or inputs.
        shown = (changed + same)[:SHOWN_DRIFTS]
        for drift in shown:
            rules = ("; refused by today's validation" if drift.get("refused_today")
                     else f"; rules {drift['rules_version']} -> {drift['current_rules_version']}"
                     if drift["older_rules"] else "")
            lines.append(f"  #{drift['position']} {drift['command_id']}: "
                         f"{drift['recorded']['outcome']} -> {drift['rederived']['outcome']} "
                         f"({', '.join(drift['changed_fields'])}{rules})")
        if len(drifts) > len(shown):
            lines.append(f"  … and {len(drifts) - len(shown)} more (--json lists every one)")
    return "\n".join(lines)


SHOWN_DRIFTS = 50


def _rows(differences: list[dict[str, Any]], total: int) -> str:
    """The first few differing rows as projection/key, and whether there are more."""
    named = ", ".join(f"{d['projection']}/{d['key']}" for d in differences[:5])
    return f"{named}, …" if total > 5 else named


@click.command()
@click.option("--to", "to_position", type=click.IntRange(min=0), default=None,
              help="Rebuild the state as of this position (the head, if past it).")
@click.option("--verify", "verify_", is_flag=True,
              help="Re-derive every decision and report identical or drifted.")
@click.option("--policy", "policy_file", type=click.Path(path_type=Path), default=None,
              help="What-if: re-derive with these policy parameters (the live log is untouched).")
@click.option("--rebuild", is_flag=True, help="Drop and rebuild the live projections.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def replay(to_position: int | None, verify_: bool, policy_file: Path | None, rebuild: bool,
           as_json: bool) -> int:
    """Rebuild every projection from the log and compare it with the live state."""
    # Read before anything is written: a bad policy file leaves the projections as they were.
    overrides = load_overrides(policy_file) if policy_file else None
    store = existing_store()
    report: dict[str, Any] = {}
    failed = False
    head = store.head()[0]
    if to_position is not None:
        # As `status --at`: a position past the head is the head, and the report says which.
        to_position = min(to_position, head)
    if verify_ or policy_file:
        # First, as it only reads: a what-if that does not fit a version in the log is refused
        # (exit 2) before --rebuild has written anything.
        policies = PolicyBook(overrides)
        # Events read, out of the events there are to read: the log up to the cut, or its head.
        with progress("what-if: events read" if policy_file else "verify: events read",
                      to_position if to_position is not None else head) as report_progress:
            result = verify_decisions(store, policies, to_position, report_progress)
        report.update(decisions_checked=result.decisions_checked,
                      decisions_unchecked=result.decisions_unchecked, what_if=bool(policy_file),
                      drifts=[d.as_dict() for d in result.drifts],
                      unexplained_drifts=len(result.unexplained))
        # A drift under plain --verify of a decision made under today's rules means the recorded
        # history cannot be reproduced; one made under older rules is an upgrade's, reported.
        failed = bool(result.unexplained) and not policy_file
    if rebuild:
        with progress("rebuild: events folded", store.head()[0]) as report_progress:
            rebuilt = rebuild_live(store, report_progress)
        report["rebuilt_events"] = rebuilt.events_folded
        # What the rebuild repaired: a live state that was not the log's is a check that said
        # no, as plain `replay` reports it, though the state is now right.
        report["differences_repaired"] = rebuilt.differences_repaired
        report["repaired_differences"] = rebuilt.differences
        failed = failed or bool(rebuilt.differences_repaired)
    if to_position is not None:
        # Never inside a decision: a state folded there was never committed; --verify's
        # counts stay as the cut was asked (the decision is left unchecked there).
        report["position"] = whole_decisions_cut(store, to_position)
        if report["position"] != to_position:
            report["requested_position"] = to_position
        with progress("replay: events folded", report["position"]) as report_progress:
            report["state"] = state_at(store, report["position"], report_progress).snapshot()
    elif not (verify_ or policy_file or rebuild):  # a rebuild compared before it rewrote
        with progress("replay: events folded", store.head()[0]) as report_progress:
            report["projection_differences"] = compare_with_live(store, report_progress)
        failed = failed or bool(report["projection_differences"])
    emit(report, as_json, _render)
    return 1 if failed else 0
