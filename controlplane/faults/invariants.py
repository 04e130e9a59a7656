"""What must hold after any fault: the fleet's invariants, checked against the log alone.

Each check returns stable `code: detail` strings, so a report can count them and a test can
assert there are none.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from controlplane.decisions import ACCEPTED
from controlplane.handlers import OBSERVATIONS
from controlplane.replay import compare_with_live
from controlplane.replay.verify import verify_decisions
from controlplane.state.fleet import GPUS_RELEASED, GPUS_RESERVED
from events.model import RecordedEvent
from events.store import EventStore
from events.verify import verify_log


@dataclass
class InvariantReport:
    """How much each invariant looked at, and every violation found (empty when all hold)."""

    commands_accepted: int = 0
    commands_decided: int = 0
    reservations_folded: int = 0
    budget_checks: int = 0
    decisions_rederived: int = 0
    events_chained: int = 0
    violations: list[str] = field(default_factory=list)


def decided_exactly_once(events: Iterable[RecordedEvent], report: InvariantReport) -> None:
    """Every accepted command is decided exactly once: one read position for all its events."""
    accepted: list[str] = []
    read_positions: dict[str, set[int]] = defaultdict(set)
    for event in events:
        if event.event_type == ACCEPTED and event.command_id:
            accepted.append(event.command_id)
        elif event.command_id and event.event_type not in OBSERVATIONS:
            read_positions[event.command_id].add(int(event.data.get("read_position", -1)))
    report.commands_accepted = len(accepted)
    if len(set(accepted)) != len(accepted):
        report.violations.append("accepted_twice: a command id is in the inbox more than once")
    for command_id in accepted:
        seen = read_positions.get(command_id, set())
        if not seen:
            report.violations.append(f"undecided: {command_id}")
        elif len(seen) > 1:
            report.violations.append(f"decided_twice: {command_id} at read positions {sorted(seen)}")
        else:
            report.commands_decided += 1
    for command_id in sorted(set(read_positions) - set(accepted)):
        report.violations.append(f"decided_unaccepted: {command_id}")


def _reservations(events: Iterable[RecordedEvent], report: InvariantReport) -> None:
    """A fold of reservations and releases never holds one GPU for two replicas at once."""
    holder: dict[tuple[str, str], str] = {}
    for event in events:
        if event.event_type not in (GPUS_RESERVED, GPUS_RELEASED):
            continue
        change = event.data["result"]
        report.reservations_folded += 1
        for gpu_id in change["gpu_ids"]:
            key = (change["node_id"], gpu_id)
            if event.event_type == GPUS_RESERVED:
                if key in holder:
                    report.violations.append(
                        f"gpu_reserved_twice: {key[0]}/{gpu_id} held by {holder[key]}, "
                        f"reserved for {change['replica_id']} at position {event.position}")
                holder[key] = change["replica_id"]
            elif holder.pop(key, None) is None:
                report.violations.append(f"gpu_released_unheld: {key[0]}/{gpu_id} "
                                         f"at position {event.position}")


def gpu_holds(events: Iterable[RecordedEvent]) -> Counter[tuple[str, str]]:
    """Live reservations per GPU, (node id, GPU id), folded by hand from reservations and
    releases: each is 1 while reserved and 0 once released; anything else is a double booking."""
    holds: Counter[tuple[str, str]] = Counter()
    for event in events:
        if event.event_type in (GPUS_RESERVED, GPUS_RELEASED):
            step = 1 if event.event_type == GPUS_RESERVED else -1
            change = event.data["result"]
            for gpu_id in change["gpu_ids"]:
                holds[(change["node_id"], gpu_id)] += step
    return holds


def _budgets(events: Iterable[RecordedEvent], report: InvariantReport) -> None:
    """Live-token reservations stay within [0, the pool's budget] after every decision."""
    for event in events:
        for reason in event.data.get("reasons", ()) if event.event_type != ACCEPTED else ():
            facts = reason.get("facts") or {}
            after = facts.get("live_tokens_after")
            if after is None:
                continue
            report.budget_checks += 1
            limit = facts.get("max_live_tokens")
            if after < 0 or (limit is not None and after > limit):
                report.violations.append(f"budget_overspent: {event.command_id} leaves "
                                         f"{after} live tokens (budget {limit})")


def check_fleet_invariants(store: EventStore) -> InvariantReport:
    """Decided exactly once, no GPU held twice, no budget overspent, the chain verifies,
    the replayed state equals the live one and every decision re-derives identically."""
    report = InvariantReport()
    events = list(store.read_all())
    decided_exactly_once(events, report)
    _reservations(events, report)
    _budgets(events, report)
    chain = verify_log(store)
    report.events_chained = chain.events_checked
    if not chain.ok:
        report.violations.append(f"chain_broken: {chain.problem} at {chain.first_bad_position}")
    report.violations += [f"replay_differs: {d['projection']}/{d['key']}"
                          for d in compare_with_live(store)]
    rederived = verify_decisions(store)
    report.decisions_rederived = rederived.decisions_checked
    report.violations += [f"decision_drifted: {d.command_id} ({', '.join(d.changed_fields)})"
                          for d in rederived.drifts]
    return report


def assert_fleet_invariants(store: EventStore) -> InvariantReport:
    """`check_fleet_invariants`, raising AssertionError naming every violation."""
    report = check_fleet_invariants(store)
    assert not report.violations, "\n".join(report.violations[:20])
    return report
