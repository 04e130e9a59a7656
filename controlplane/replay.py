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
from controlplane.decisions import ACCEPTED, DecisionContext
from controlplane.handlers import OBSERVATIONS, decide_command
from controlplane.policy_book import PolicyBook
from controlplane.state.fold import apply_event
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


def state_at(store: EventStore, position: int | None = None) -> MemoryProjections:
    """The fleet state as of `position` (the whole log when None)."""
    return fold(store.read_all(to_position=position))


def diff_tables(live: dict[str, dict[str, Any]], rebuilt: dict[str, dict[str, Any]],
                limit: int = 20) -> list[dict[str, Any]]:
    """Rows that differ between two projection snapshots, at most `limit` of them."""
    differences = []
    for name in sorted(set(live) | set(rebuilt)):
        left, right = live.get(name, {}), rebuilt.get(name, {})
        for key in sorted(set(left) | set(right)):
            if left.get(key) != right.get(key):
                differences.append({"projection": name, "key": key, "live": left.get(key),
                                    "rebuilt": right.get(key)})
                if len(differences) >= limit:
                    return differences
    return differences


def compare_with_live(store: EventStore) -> list[dict[str, Any]]:
    """Rebuild every projection in memory and list where the live tables differ."""
    with store.engine.connect() as conn:
        live = load_all(conn)
    return diff_tables(live, fold(store.read_all()).snapshot())


PROJECTIONS_REBUILT = "ProjectionsRebuilt"
MAINTENANCE_STREAM = "maintenance/projections"


def rebuild_live(store: EventStore) -> int:
    """Drop the live projections and write them again from the log; returns events folded.

    The fold runs in memory under the append lock and only its final rows are written, in the
    same transaction, so nobody sees a half-built state and the write buffer holds the bounded
    state rather than every row the log ever touched. The rebuild is recorded in the log
    (`ProjectionsRebuilt`, which folds to nothing): the head moves, so every process that keeps
    projection rows cached for the old head reads them again.
    """
    with store.transaction() as tx:
        drop_all(tx.connection)
        state = MemoryProjections()
        count = 0
        for event in store.read_all(to_position=tx.head_position):
            apply_event(state, event)
            count += 1
        for name, rows in state.tables.items():
            for key, value in rows.items():
                tx.projections.put(name, key, value)
        through = tx.head_position
        tx.append([StreamAppend(MAINTENANCE_STREAM, None, [NewEvent(
            event_id=derived_event_id("projections-rebuilt", str(through)),
            event_type=PROJECTIONS_REBUILT,
            data={"events_folded": count, "through_position": through},
            occurred_at=datetime.now(UTC).isoformat(timespec="microseconds"),
            actor="operator", tenant="system")])])
    return count


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
    """A decision whose re-derivation differs from what was recorded."""

    command_id: str
    position: int
    event_type: str
    recorded: dict[str, Any]
    rederived: dict[str, Any]
    changed_fields: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"command_id": self.command_id, "position": self.position,
                "event_type": self.event_type, "changed_fields": self.changed_fields,
                "recorded": self.recorded, "rederived": self.rederived}


@dataclass
class VerifyReport:
    decisions_checked: int = 0
    drifts: list[Drift] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.drifts


def _comparable(events: list[dict[str, Any]], what_if: bool) -> list[dict[str, Any]]:
    # Under a what-if the policy block differs by construction; compare what was decided.
    if not what_if:
        return events
    return [{**e, "data": {k: v for k, v in e["data"].items() if k != "policy"}} for e in events]


def verify_decisions(store: EventStore, policies: PolicyBook | None = None,
                     to_position: int | None = None,
                     progress: ProgressFn | None = None) -> VerifyReport:
    """Re-derive every decision from its command and the state just before it; list drifts."""
    policies = policies or PolicyBook()
    what_if = bool(policies.overrides)
    state = MemoryProjections()
    versions = StreamVersions(store)
    commands: dict[str, tuple[dict[str, Any], str]] = {}
    report = VerifyReport()
    group: list[RecordedEvent] = []

    def settle() -> None:
        if group:
            _check(group, commands, state, versions, policies, what_if, report)
            for event in group:
                _fold_one(state, versions, event)
            group.clear()

    with closing(versions):
        for count, event in enumerate(store.read_all(to_position=to_position), 1):
            if group and event.command_id != group[0].command_id and not (
                    event.event_type == ACCEPTED and event.causation_id is not None):
                settle()
            if event.event_type == ACCEPTED and group and event.causation_id is not None \
                    and event.causation_id in {e.event_id for e in group}:
                # A follow-up command the open decision issued: part of that decision.
                group.append(event)
                commands[event.data["command"]["command_id"]] = (event.data["command"],
                                                                   event.event_id)
            elif event.event_type == ACCEPTED:
                settle()
                commands[event.data["command"]["command_id"]] = (event.data["command"],
                                                                   event.event_id)
                _fold_one(state, versions, event)
            elif (event.command_id is not None and event.command_id in commands
                  and event.event_type not in OBSERVATIONS):
                group.append(event)
            else:
                settle()
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
    first = group[0]
    payload, accepted_id = commands.pop(first.command_id or "")
    command = parse_command(payload)
    context = DecisionContext(state, first.position - 1, versions.before(group), policies,
                              accepted_id)
    appends = decide_command(command, context)
    rederived = [{"stream_id": a.stream_id, "event_type": e.event_type, "data": e.data}
                 for a in appends for e in a.events]
    recorded = [{"stream_id": e.stream_id, "event_type": e.event_type, "data": e.data}
                for e in group]
    report.decisions_checked += 1
    left, right = _comparable(recorded, what_if), _comparable(rederived, what_if)
    if left != right:
        changed = sorted({key for a, b in zip(left, right, strict=False)
                          for key in set(a["data"]) | set(b["data"])
                          if a["data"].get(key) != b["data"].get(key)})
        if len(left) != len(right):
            changed.append("event_count")
        report.drifts.append(Drift(first.command_id or "", first.position, first.event_type,
                                   _summary(recorded), _summary(rederived), changed))


def _summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    decision: dict[str, Any] = next((e["data"] for e in events if "outcome" in e["data"]), {})
    return {"outcome": decision.get("outcome"),
            "reasons": [r["code"] for r in decision.get("reasons", [])],
            "result": decision.get("result"),
            "events": [f"{e['event_type']}@{e['stream_id']}" for e in events]}
