"""Memory-fit handlers."""

from __future__ import annotations

from controlplane.commands.base import CommandBase
from controlplane.commands.memory import AssessMemory
from controlplane.decisions import (
    DecisionContext,
    append_to,
    decision_data,
    new_event,
    rejection,
)
from controlplane.handlers.base import Handler, Streams
from controlplane.policies.memory import DeploymentMemory, ModelMemory, assess_memory
from controlplane.policies.reasons import PolicyInputError, to_plain
from controlplane.state.memory import MEMORY_ASSESSED
from events.model import StreamAppend


def memory_stream(model_name: str) -> str:
    """The stream of a model's memory assessments."""
    return f"memory/{model_name}"


def _streams(command: CommandBase) -> list[str]:
    assert isinstance(command, AssessMemory)
    return [memory_stream(command.model_name)]


def handle_assess_memory(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Decide memory fit with the memory policy in force; the command's own fraction wins."""
    assert isinstance(command, AssessMemory)
    stream_id = memory_stream(command.model_name)
    policy = ctx.policies.in_force(ctx.state, "memory")
    deployment_fields = command.deployment.model_dump()
    if deployment_fields["usable_fraction"] is None:
        deployment_fields["usable_fraction"] = policy.parameters["usable_fraction"]
    model = ModelMemory(**command.model.model_dump())
    deployment = DeploymentMemory(**deployment_fields)
    try:
        assessment = assess_memory(model, deployment)
    except PolicyInputError as error:
        return rejection(command, ctx, error, stream_id)
    result = to_plain(assessment)
    reasons = assessment.reasons
    del result["reasons"]
    data = decision_data(
        outcome="fits" if assessment.fits else "does_not_fit", reasons=reasons, result=result,
        policy=policy, inputs={"model_name": command.model_name, "model": to_plain(model),
                               "deployment": to_plain(deployment)}, ctx=ctx)
    return [append_to(stream_id, ctx, new_event(command, ctx, "decision", MEMORY_ASSESSED, data))]


HANDLERS: dict[str, Handler] = {
    "AssessMemory": handle_assess_memory,
}
STREAMS: dict[str, Streams] = {"AssessMemory": _streams}
