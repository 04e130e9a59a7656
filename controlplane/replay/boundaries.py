"""A recorded decision's extent in the log: the events that belong to it, and cuts that split none.

A decision's events (and the follow-up commands it accepts) are appended in one transaction, so
replay re-derives a decision whole, and `whole_decisions_cut` moves a cut out of the inside of one
(or of the observations an outside effect recorded together).
"""

from __future__ import annotations

from controlplane.decisions import ACCEPTED
from controlplane.handlers import OBSERVATIONS
from events.model import RecordedEvent
from events.store import EventStore


def continues_decision(group: list[RecordedEvent], event: RecordedEvent) -> bool:
    """Whether `event` belongs to the open decision `group`: another of its command's events,
    or a follow-up command the decision issued (accepted with the decision as its cause)."""
    if event.event_type == ACCEPTED:
        return event.causation_id is not None and event.causation_id in {e.event_id
                                                                         for e in group}
    return event.command_id == group[0].command_id and event.event_type not in OBSERVATIONS


def _continues_unit(group: list[RecordedEvent], event: RecordedEvent) -> bool:
    """Whether `event` belongs to the open unit `group`: a decision (`continues_decision`), or
    an outside effect's observations, which its effect records in a transaction of their own
    (an operation completed and its budget settled): the same command's, appended together."""
    first = group[0]
    if first.event_type in OBSERVATIONS:
        # One transaction's: the head it read is its own (the next one reads past its events);
        # a clock that did not tick between two transactions would merge them.
        return (event.event_type in OBSERVATIONS and event.command_id == first.command_id
                and event.data.get("read_position") == first.data.get("read_position"))
    return continues_decision(group, event)


def _issued_before(upto: list[RecordedEvent], after: RecordedEvent,
                   events: list[RecordedEvent]) -> bool:
    """Whether the cut falls among the acceptances of commands issued by a decision that begins
    before the window `events` was read over: the last event before the cut, or the first
    after it, is one whose cause the window does not hold. (A decision's events and the
    commands it issues are appended together, so everything from its cause to them is it.)"""
    inside = {event.event_id for event in events}
    return any(event.event_type == ACCEPTED and event.causation_id is not None
               and event.causation_id not in inside for event in (*upto[-1:], after))


# Events a decision's window is first read back over; doubled while the decision starts before.
_CUT_WINDOW = 64


def whole_decisions_cut(store: EventStore, position: int) -> int:
    """`position`, or the last position before it that no decision runs past: the end of the
    last decision wholly at or before `position`.

    A decision's events (and the follow-up commands it accepts) are appended in one
    transaction, so a state folded to a position inside them was never committed: a replica
    placed on a GPU that still counts as free. A cut there moves back to just before that
    decision; so does one inside the observations an outside effect recorded together (an
    operation completed with its grant still reserved). (Positions past the head are the
    head's; 0 is 0.)
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
            if group and _continues_unit(group, event):
                group.append(event)
            elif event.event_type != ACCEPTED and event.command_id:
                group = [event]
            else:
                group = []
        if not group and start > 0 and _issued_before(upto, after, events):
            window *= 2  # inside the commands a decision before the window issued
            continue
        if not group or not _continues_unit(group, after):
            return position
        if group[0].position > start + 1 or start == 0:
            return group[0].position - 1
        window *= 2  # the decision may begin before the window: read further back
