"""The decision on a recorded command that this version's validation refuses
(`commands/refused.py`): a rejection in the inbox, beside its acceptance, naming the problems,
so the rest of its batch is decided and it is never retried (resubmit it, in today's form,
under a new id)."""

from __future__ import annotations

from controlplane.commands.base import CommandBase
from controlplane.commands.refused import REFUSED_COMMAND, RefusedCommand
from controlplane.decisions import INBOX_STREAM, REJECTED, DecisionContext, decision_data, new_event
from controlplane.handlers.base import Handler
from controlplane.policies.reasons import Reason
from events.model import StreamAppend


def handle_refused(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    assert isinstance(command, RefusedCommand)
    reason = Reason("command_refused_by_validation",
                    f"this version's validation refuses the {command.recorded_type} command as it "
                    "was accepted (an upgrade tightened it): resubmit it, as the submit "
                    "checks now require, under a new id",
                    {"command_type": command.recorded_type, "problems": command.problems})
    data = decision_data(outcome="rejected", reasons=[reason], result={}, policy=None,
                         inputs=command.recorded, ctx=ctx)
    return [StreamAppend(INBOX_STREAM, None, [new_event(command, ctx, "rejected", REJECTED, data)])]


HANDLERS: dict[str, Handler] = {REFUSED_COMMAND: handle_refused}
