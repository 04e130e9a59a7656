"""A command recorded in the inbox that this version's validation refuses.

Validation tightens between versions (an id may no longer hold ':', a bound gets lower): a
command accepted before the upgrade may be refused by `parse_command` today. Deciding it must
not fail its whole batch on every retry, and re-deriving the log must not stop at it, so it is
read back as a `RefusedCommand` (`controlplane.commands.parse_recorded`), whose decision is a
rejection in the inbox naming the problems (`handlers/refused.py`). It is never submitted: it
is not part of the `submit` vocabulary (this module has no `COMMANDS`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from controlplane.commands.base import CommandBase
from events.model import RecordedEvent

REFUSED_COMMAND = "RefusedCommand"
MAX_PROBLEMS = 5
# pydantic's error types for what only a newer version writes: a command type, or a field,
# this one does not know (submit refuses both, in every version).
NEWER_WRITER = frozenset({"union_tag_invalid", "extra_forbidden"})


class RefusedCommand(CommandBase):
    """The recorded command (`recorded`, of type `recorded_type`) and today's problems with it;
    its envelope (id, time, actor, tenant, correlation) is its acceptance's."""

    type: Literal["RefusedCommand"] = "RefusedCommand"
    recorded_type: str
    recorded: dict[str, Any]
    problems: list[str]
    # A command type or field this version does not know: a newer fleetctl accepted it (a
    # rolling upgrade), so it is left for a worker that knows it, never rejected here.
    newer: bool = False


def refused_command(accepted: RecordedEvent, error: ValidationError) -> RefusedCommand:
    """The command `accepted` recorded, which today's validation refuses with `error`."""
    payload = accepted.data["command"]
    details = error.errors(include_url=False)
    problems = [f"{'.'.join(str(part) for part in detail['loc']) or '(command)'}: "
                f"{detail['msg']}" for detail in details]
    recorded_type = payload.get("type") if isinstance(payload, dict) else None
    # Built without validation: the envelope is the one recorded at acceptance, which today's
    # rules may refuse too (a command id of a form no longer allowed).
    return RefusedCommand.model_construct(
        command_id=accepted.command_id or "", at=datetime.fromisoformat(accepted.occurred_at),
        actor=accepted.actor, tenant=accepted.tenant, correlation_id=accepted.correlation_id,
        recorded_type=str(recorded_type),
        recorded=payload if isinstance(payload, dict) else {"value": payload},
        problems=problems[:MAX_PROBLEMS],
        newer=any(detail["type"] in NEWER_WRITER for detail in details))
