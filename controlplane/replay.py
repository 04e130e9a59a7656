"""Replay: rebuild projections from the log, and re-derive recorded decisions.

Rebuilding folds stored facts and never calls a policy. Re-deriving calls the handler on
purpose, against the state folded up to just before the decision, and compares.

Memory is flat in the log's length: events are read in chunks and folded one at a time, the
projections themselves are bounded (settled admission records are forgotten by the decisions
that say so), and re-derivation keeps only recent stream versions, reading older ones back from
the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection

from controlplane.commands import parse_command
from controlplane.decisions import ACCEPTED, DecisionContext, OutsideReads
from controlplane.handlers import OBSERVATIONS, decide_command, rules_version
from controlplane.policy_book import PolicyBook
from controlplane.state.fold import apply_event
from events.canonical import canonical_json
from events.model import NewEvent, RecordedEvent, StreamAppend, derived_event_id
from events.projections import MemoryProjections, drop_all, load_all
from events.store import EventStore
from events.tables import events_table

ProgressFn = Callable[[int], None]
_VERSION_AT = select(func.max(events_table.c.stream_version)).where(
    events_table.c.stream_id == bindparam("stream_id"),
    events_table.c.position <= bindparam("position"))


def fold(events: Iterator[RecordedEvent], progress: ProgressFn | None = None) \
        -> MemoryProjections:
    """Fold events into fresh in-memory projections."""
    state = MemoryProjections()
    for count, event in enumerate(events, 1):
        apply_event(state, event)
        if progress is not None and count % 10_000 == 0:
            progress(count)
    return state


def state_at(store: EventStore, position: int | None = None,
             progress: ProgressFn | None = None) -> MemoryProjections:
    """The fleet state as of `position` (the whole log when None); `progress` is told the
    events folded, every 10,000."""
    return fold(store.read_all(to_position=position), progress)


def _canonical(value: Any) -> str:
    """`value`'s canonical JSON, by which replay compares what is stored: 1, 1.0 and true differ,
    as their stored texts do. A value that has none (a NaN read from a hand-edited row) is
    compared by its repr, unequal to any canonical text."""
    try:
        return canonical_json(value)
    except (TypeError, ValueError):
        return f"not JSON: {value!r}"


def _differs(left: dict[str, Any], right: dict[str, Any], key: str) -> bool:
    """Whether `key` is in only one of the two, or their values' canonical JSON differs."""
    if (key in left) != (key in right):
        return True
    return key in left and _canonical(left[key]) != _canonical(right[key])


def diff_tables(live: dict[str, dict[str, Any]], rebuilt: dict[str, dict[str, Any]],
                limit: int | None = 20) -> list[dict[str, Any]]:
    """Rows that differ between two projection snapshots (as canonical JSON), at most `limit`
    (every one when None: the entries refer to the snapshots' rows, they copy none)."""
    differences = []
    for name in sorted(set(live) | set(rebuilt)):
        left, right = live.get(name, {}), rebuilt.get(name, {})
        for key in sorted(set(left) | set(right)):
            if _differs(left, right, key):
                differences.append({"projection": name, "key": key, "live": left.get(key),
                                    "rebuilt": right.get(key)})
                if limit is not None and len(differences) >= limit:
                    return differences
    return differences


def compare_with_live(store: EventStore, progress: ProgressFn | None = None) \
        -> list[dict[str, Any]]:
    """Rebuild every projection in memory and list where the live tables differ, both as of one
    head: the live rows are read with it (`EventStore.snapshot`), the log folded up to it, so
    what other processes append meanwhile is in neither. `progress` as for `state_at`."""
    with store.snapshot() as conn:
        head, _ = store.head(conn)
        live = load_all(conn)
    return diff_tables(live, state_at(store, head, progress).snapshot())


PROJECTIONS_REBUILT = "ProjectionsRebuilt"
MAINTENANCE_STREAM = "maintenance/projections"


@dataclass(frozen=True)
class Rebuilt:
    """What `rebuild_live` did: events folded, how many live rows differed from the fold before
    they were rewritten, and the first 20 of them (as `diff_tables` lists them)."""

    events_folded: int
    differences_repaired: int
    differences: list[dict[str, Any]]


def rebuild_live(store: EventStore, progress: ProgressFn | None = None) -> Rebuilt:
    """Drop the live projections and write them again from the log (`progress` is told how many
    events were folded, every 10,000).

    The fold runs in memory under the append lock and only its final rows are written, in the
    same transaction, so nobody sees a half-built state and the write buffer holds the bounded
    state rather than every row the log ever touched. The live rows are compared with the fold
    first: a rebuild repairs a state that was wrong, and says so, rather than hiding it. The
    rebuild is recorded in the log (`ProjectionsRebuilt`, which folds to nothing, with how many
    rows it repaired): the head moves, so every process that keeps projection rows cached for
    the old head reads them again.
    """
    with store.transaction() as tx:
        live = load_all(tx.connection)
        drop_all(tx.connection)
        state = MemoryProjections()
        count = 0
        for event in store.read_all(to_position=tx.head_position):
            apply_event(state, event)
            count += 1
            if progress is not None and count % 10_000 == 0:
                progress(count)
        differences = diff_tables(live, state.snapshot(), limit=None)
        repaired, differences = len(differences), differences[:20]
        del live
        for name, rows in state.tables.items():
            for key, value in rows.items():
                tx.projections.put(name, key, value)
        through = tx.head_position
        tx.append([StreamAppend(MAINTENANCE_STREAM, None, [NewEvent(
            event_id=derived_event_id("projections-rebuilt", str(through)),
            event_type=PROJECTIONS_REBUILT,
            data={"events_folded": count, "through_position": through,
                  "differences_repaired": repaired},
            occurred_at=datetime.now(UTC).isoformat(timespec="microseconds"),
            actor="operator", tenant="system")])])
    return Rebuilt(count, repaired, differences)


class StreamVersions:
    """Each stream's version as of the last folded event, in bounded memory.

    The versions of recently written streams are kept in two generations of at most `limit`
    each; a stream written longer ago is read back from the log, at the folded position. A
    stream the recorded decision appended to needs neither: its version before the decision is
    one below the decision's first event on it (`before`).
    """

    def __init__(self, store: EventStore, limit: int = 50_000) -> None:
        self.store, self.limit = store, limit
        self.young: dict[str, int] = {}
        self.old: dict[str, int] = {}
        self.dropped_any = False
        self.position = 0
        self._connection: Connection | None = None

    def folded(self, event: RecordedEvent) -> None:
        """Record that `event` is folded: its stream is at its version."""
        self.young[event.stream_id] = event.stream_version
        self.position = event.position
        if len(self.young) > self.limit:
            self.dropped_any = self.dropped_any or bool(self.old)
            self.old, self.young = self.young, {}

    def __call__(self, stream_id: str) -> int:
        """The stream's version as of the folded position, 0 for a stream not yet written."""
        version = self.young.get(stream_id)
        if version is None:
            version = self.old.get(stream_id)
        if version is None:
            version = self._read_back(stream_id) if self.dropped_any else 0
        return version

    def before(self, decision: list[RecordedEvent]) -> Callable[[str], int]:
        """Stream versions just before `decision`'s events, which are not folded yet."""
        appended: dict[str, int] = {}
        for event in decision:
            appended.setdefault(event.stream_id, event.stream_version - 1)
        return lambda stream_id: appended[stream_id] if stream_id in appended else self(stream_id)

    def _read_back(self, stream_id: str) -> int:
        if self._connection is None:
            self._connection = self.store.engine.connect()
        found = self._connection.execute(_VERSION_AT, {"stream_id": stream_id,
                                                       "position": self.position}).scalar()
        return int(found or 0)

    def close(self) -> None:
        """Release the connection used to read versions back, if one was opened."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


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

    @property
    def older_rules(self) -> bool:
        """Decided under older rules than today's: explained by an upgrade, not a fault."""
        return self.rules_version < self.current_rules_version

    def as_dict(self) -> dict[str, Any]:
        return {"command_id": self.command_id, "position": self.position,
                "event_type": self.event_type, "changed_fields": self.changed_fields,
                "rules_version": self.rules_version,
                "current_rules_version": self.current_rules_version,
                "older_rules": self.older_rules,
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
        """The drifts of decisions made under today's rules (or newer): the recorded history
        cannot be reproduced by the rules that made it."""
        return [drift for drift in self.drifts if not drift.older_rules]


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


def _continues(group: list[RecordedEvent], event: RecordedEvent) -> bool:
    """Whether `event` belongs to the open decision `group`: another of its command's events,
    or a follow-up command the decision issued (accepted with the decision as its cause)."""
    if event.event_type == ACCEPTED:
        return event.causation_id is not None and event.causation_id in {e.event_id
                                                                         for e in group}
    return event.command_id == group[0].command_id and event.event_type not in OBSERVATIONS


# Events a decision's window is first read back over; doubled while the decision starts before.
_CUT_WINDOW = 64


def whole_decisions_cut(store: EventStore, position: int) -> int:
    """`position`, or the last position before it that no decision runs past: the end of the
    last decision wholly at or before `position`.

    A decision's events (and the follow-up commands it accepts) are appended in one
    transaction, so a state folded to a position inside them was never committed: a replica
    placed on a GPU that still counts as free. A cut there moves back to just before that
    decision. (Positions past the head are the head's; 0 is 0.)
    """
    window = _CUT_WINDOW
    while True:
        start = max(0, position - window)
        events = list(store.read_all(from_position=start, to_position=position + 1))
        if not events or events[-1].position <= position:
            return position  # nothing after the cut: no decision runs past it
        *upto, after = events
        group: list[RecordedEvent] = []
        for event in upto:
            if group and _continues(group, event):
                group.append(event)
            elif event.event_type not in (ACCEPTED, *OBSERVATIONS) and event.command_id:
                group = [event]
            else:
                group = []
        if not group or not _continues(group, after):
            return position
        if group[0].position > start + 1 or start == 0:
            return group[0].position - 1
        window *= 2  # the decision may begin before the window: read further back


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
    commands: dict[str, tuple[dict[str, Any], str]] = {}
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
                if group and _continues(group, event):
                    report.decisions_unchecked += 1
                    group.clear()
                break
            joins = bool(group) and _continues(group, event)
            if not joins and group and event.event_type in OBSERVATIONS \
                    and event.command_id == group[0].command_id:
                observed.append(event)
                continue
            if not joins:
                settle()
            if event.event_type == ACCEPTED:
                commands[event.data["command"]["command_id"]] = (event.data["command"],
                                                                   event.event_id)
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


def _check(group: list[RecordedEvent], commands: dict[str, tuple[dict[str, Any], str]],
           state: MemoryProjections, versions: StreamVersions, policies: PolicyBook,
           what_if: bool, report: VerifyReport) -> None:
    """Re-derive the decision `group` holds from its command, the state folded before it and
    what it recorded reading from outside the log (never the outside world as it is now, but
    for a decision recorded before such reads were recorded: `OutsideReads`); add a drift to
    `report` where it comes out differently."""
    first = group[0]
    payload, accepted_id = commands.pop(first.command_id or "")
    command = parse_command(payload)
    decision = next((e.data for e in group if "outcome" in e.data), {})
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
    if _canonical(left) != _canonical(right):  # as stored: 1, 1.0 and true differ
        changed = sorted({key for a, b in zip(left, right, strict=False)
                          for key in set(a["data"]) | set(b["data"])
                          if _differs(a["data"], b["data"], key)}
                         # An event's type or stream, which its data does not hold.
                         | {field for a, b in zip(left, right, strict=False)
                            for field in ("event_type", "stream_id") if a[field] != b[field]})
        if len(left) != len(right):
            changed.append("event_count")
        version = decision.get("rules_version", 1)
        report.drifts.append(Drift(first.command_id or "", first.position, first.event_type,
                                   _summary(recorded), _summary(rederived), changed,
                                   version if type(version) is int else 1,
                                   rules_version(command.command_type)))


def _unversioned(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key != "rules_version"} \
        if "rules_version" in data else data


def _summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    decision: dict[str, Any] = next((e["data"] for e in events if "outcome" in e["data"]), {})
    return {"outcome": decision.get("outcome"),
            "reasons": [r["code"] for r in decision.get("reasons", [])],
            "result": decision.get("result"),
            "events": [f"{e['event_type']}@{e['stream_id']}" for e in events]}
