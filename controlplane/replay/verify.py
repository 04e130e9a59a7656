"""Replay's re-derivation: every recorded decision decided again and compared (verify, what-if).

Re-deriving calls the handler on purpose, against the state folded up to just before the
decision, with the stream versions it read and what it recorded reading from outside the log,
and reports each decision that comes out differently as a drift. Under a what-if (other policy
parameters) the comparison is of what was decided, not of which policy version decided it.
Memory is flat in the log's length: events are folded one at a time, and only recent stream
versions are kept (`StreamVersions`), older ones read back from the log.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from controlplane.commands import CommandBase, parse_recorded
from controlplane.commands.refused import RefusedCommand
from controlplane.decisions import ACCEPTED, DecisionContext, OutsideReads
from controlplane.errors import OperationalError
from controlplane.handlers import OBSERVATIONS, decide_command, rules_version
from controlplane.policy_book import PolicyBook
from controlplane.replay.boundaries import continues_decision
from controlplane.replay.diff import comparable_json, key_differs
from controlplane.replay.fold import ProgressFn
from controlplane.replay.versions import StreamVersions
from controlplane.state.fold import apply_event, reading, unreadable
from events.model import RecordedEvent
from events.projections import MemoryProjections
from events.rows import as_written
from events.store import EventStore


@dataclass
class Drift:
    """A decision whose re-derivation differs from what was recorded, and the versions of its
    command's rules then (1 if none was recorded) and now."""

    command_id: str
    position: int
    event_type: str
    recorded: dict[str, Any]
    rederived: dict[str, Any]
    changed_fields: list[str] = field(default_factory=list)
    rules_version: int = 1
    current_rules_version: int = 1
    # Today's validation refuses the command as recorded (`RefusedCommand`): re-derived, it is
    # rejected; explained by an upgrade that tightened validation, not a fault.
    refused_today: bool = False

    @property
    def older_rules(self) -> bool:
        """Decided under older rules than today's: explained by an upgrade, not a fault."""
        return self.rules_version < self.current_rules_version

    @property
    def explained(self) -> bool:
        """Explained by an upgrade: older rules, or a command today's validation refuses."""
        return self.older_rules or self.refused_today

    def as_dict(self) -> dict[str, Any]:
        return {"command_id": self.command_id, "position": self.position,
                "event_type": self.event_type, "changed_fields": self.changed_fields,
                "rules_version": self.rules_version,
                "current_rules_version": self.current_rules_version,
                "older_rules": self.older_rules, "refused_today": self.refused_today,
                "recorded": self.recorded, "rederived": self.rederived}


@dataclass
class VerifyReport:
    """Decisions re-derived, those that drifted, and those a `to_position` cut in two (left
    unchecked: their recorded events are not all there to compare)."""

    decisions_checked: int = 0
    drifts: list[Drift] = field(default_factory=list)
    decisions_unchecked: int = 0

    @property
    def identical(self) -> bool:
        return not self.drifts

    @property
    def unexplained(self) -> list[Drift]:
        """The drifts of decisions made under today's rules (or newer) of commands today's
        validation accepts: the recorded history cannot be reproduced by the rules that made
        it."""
        return [drift for drift in self.drifts if not drift.explained]


# The version `PolicyBook` gives a policy a what-if overrides.
WHAT_IF_VERSION = "what-if"


def _comparable(recorded: list[dict[str, Any]], rederived: list[dict[str, Any]], what_if: bool
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The recorded and re-derived events as compared: under a what-if, what was decided, not
    which policy version decided it. The policy block differs by construction, and so does the
    version wherever a decision copies it (a shed's facts, a rollout's result): where the
    re-derived data holds the what-if version, a version number recorded there counts as it."""
    if not what_if:
        return recorded, rederived
    right = [{**e, "data": {k: v for k, v in e["data"].items() if k != "policy"}}
             for e in rederived]
    left = [{**e, "data": _with_what_if_versions(
                {k: v for k, v in e["data"].items() if k != "policy"},
                right[index]["data"] if index < len(right) else {})}
            for index, e in enumerate(recorded)]
    return left, right


def _with_what_if_versions(recorded: Any, rederived: Any) -> Any:
    """`recorded` with the what-if version in every place where `rederived` holds it and
    `recorded` a version number; everything else as recorded."""
    if rederived == WHAT_IF_VERSION and type(recorded) is int:
        return WHAT_IF_VERSION
    if isinstance(recorded, dict) and isinstance(rederived, dict):
        return {key: _with_what_if_versions(value, rederived[key]) if key in rederived else value
                for key, value in recorded.items()}
    if isinstance(recorded, list) and isinstance(rederived, list):
        return [_with_what_if_versions(value, rederived[index]) if index < len(rederived)
                else value for index, value in enumerate(recorded)]
    return recorded


def verify_decisions(store: EventStore, policies: PolicyBook | None = None,
                     to_position: int | None = None,
                     progress: ProgressFn | None = None) -> VerifyReport:
    """Re-derive every decision from its command and the state just before it; list drifts.

    With `to_position`, the decisions up to it; one whose events run past it is left
    unchecked (and counted so), never reported as a drift.
    """
    policies = policies or PolicyBook()
    what_if = bool(policies.overrides)
    state = MemoryProjections()
    versions = StreamVersions(store)
    commands: dict[str, tuple[CommandBase, str]] = {}
    report = VerifyReport()
    group: list[RecordedEvent] = []
    # Observations of the open decision's command, folded once it is complete. Effects append
    # them after the decision, but in logs written before effects marked their operations
    # themselves, a dispatching mark sat inside the decision's events.
    observed: list[RecordedEvent] = []

    def settle() -> None:
        if group:
            _check(group, commands, state, versions, policies, what_if, report)
            for event in group:
                _fold_one(state, versions, event)
            group.clear()
        for event in observed:
            _fold_one(state, versions, event)
        observed.clear()

    # One event past the cut is read only to tell whether the decision open there ends at it.
    read_to = None if to_position is None else to_position + 1
    with closing(versions):
        for count, event in enumerate(store.read_all(to_position=read_to), 1):
            if to_position is not None and event.position > to_position:
                if group and continues_decision(group, event):
                    report.decisions_unchecked += 1
                    group.clear()
                break
            joins = bool(group) and continues_decision(group, event)
            if not joins and group and event.event_type in OBSERVATIONS \
                    and event.command_id == group[0].command_id:
                observed.append(event)
                continue
            if not joins:
                settle()
            if event.event_type == ACCEPTED:
                with reading(event):
                    command = parse_recorded(event)
                if isinstance(command, RefusedCommand) and not as_written(event):
                    # Not a version's difference: the row was changed after it was written.
                    raise unreadable(event, "read", ValueError(
                        f"{'; '.join(command.problems)}, and the row no longer matches its "
                        "hash"))
                commands[command.command_id] = (command, event.event_id)
            if joins or (event.event_type != ACCEPTED and event.command_id in commands
                         and event.event_type not in OBSERVATIONS):
                group.append(event)  # the decision's, or the first event of the next one
            else:
                _fold_one(state, versions, event)
            if progress is not None and count % 10_000 == 0:
                progress(count)
        settle()
    return report


def _fold_one(state: MemoryProjections, versions: StreamVersions, event: RecordedEvent) -> None:
    versions.folded(event)
    apply_event(state, event)


def _check(group: list[RecordedEvent], commands: dict[str, tuple[CommandBase, str]],
           state: MemoryProjections, versions: StreamVersions, policies: PolicyBook,
           what_if: bool, report: VerifyReport) -> None:
    """Re-derive the decision `group` holds from its command, the state folded before it and
    what it recorded reading from outside the log (never the outside world as it is now, but
    for a decision recorded before such reads were recorded: `OutsideReads`); add a drift to
    `report` where it comes out differently."""
    first = group[0]
    command, accepted_id = commands.pop(first.command_id or "")
    decided = next((e for e in group if "outcome" in e.data), first)
    decision = decided.data if "outcome" in decided.data else {}
    _refuse_a_newer_fleetctls(decided, command, decision.get("rules_version", 1))
    # Decided at the time its events were recorded at (one append: they share it), with what
    # it read from outside the log as it recorded it.
    context = DecisionContext(state, first.position - 1, versions.before(group), policies,
                              accepted_id, recorded_at=first.recorded_at,
                              outside=OutsideReads.recorded_by(decision))
    appends = decide_command(command, context)
    # Compared without the rules version: a decision recorded before versions were lacks it.
    rederived = [{"stream_id": a.stream_id, "event_type": e.event_type, "data": _unversioned(e.data)}
                 for a in appends for e in a.events]
    recorded = [{"stream_id": e.stream_id, "event_type": e.event_type, "data": _unversioned(e.data)}
                for e in group]
    report.decisions_checked += 1
    left, right = _comparable(recorded, rederived, what_if)
    if comparable_json(left) != comparable_json(right):  # as stored: 1, 1.0 and true differ
        changed = sorted({key for a, b in zip(left, right, strict=False)
                          for key in set(a["data"]) | set(b["data"])
                          if key_differs(a["data"], b["data"], key)}
                         # An event's type or stream, which its data does not hold.
                         | {field for a, b in zip(left, right, strict=False)
                            for field in ("event_type", "stream_id") if a[field] != b[field]})
        if len(left) != len(right):
            changed.append("event_count")
        version = decision.get("rules_version", 1)
        report.drifts.append(Drift(first.command_id or "", first.position, first.event_type,
                                   _summary(recorded), _summary(rederived), changed,
                                   version if type(version) is int else 1,
                                   rules_version(command.command_type),
                                   isinstance(command, RefusedCommand)))


def _refuse_a_newer_fleetctls(decided: RecordedEvent, command: CommandBase,
                              recorded: Any) -> None:
    """OperationalError when a newer fleetctl wrote the decision `decided` records: its command
    holds a type or field this version does not know, or it was made under newer rules than
    this version's. Re-derived here it would differ, and be reported as a decision today's
    rules cannot reproduce. An edited version is named as an edit (the row no longer matches
    its hash)."""
    if isinstance(command, RefusedCommand):
        if command.newer:
            raise OperationalError(
                f"event {decided.position} decides a {command.recorded_type} command this "
                f"fleetctl does not know ({'; '.join(command.problems)}): a newer fleetctl "
                "wrote this log; re-derive it with that version")
        return
    current = rules_version(command.command_type)
    if type(recorded) is not int or recorded <= current:
        return
    if not as_written(decided):
        raise unreadable(decided, "read", ValueError(
            f"rules version {recorded}, newer than this fleetctl's {current}, and the row no "
            "longer matches its hash"))
    raise OperationalError(
        f"event {decided.position} was decided under rules version {recorded} of "
        f"{command.command_type}, newer than this fleetctl's {current}: a newer fleetctl "
        "wrote this log; re-derive it with that version")


def _unversioned(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key != "rules_version"} \
        if "rules_version" in data else data


def _summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    decision: dict[str, Any] = next((e["data"] for e in events if "outcome" in e["data"]), {})
    return {"outcome": decision.get("outcome"),
            "reasons": [r["code"] for r in decision.get("reasons", [])],
            "result": decision.get("result"),
            "events": [f"{e['event_type']}@{e['stream_id']}" for e in events]}
