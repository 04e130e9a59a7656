"""The command vocabulary: the public JSON contract of `fleetctl submit`.

Each domain module of this package lists its commands in `COMMANDS`; they are assembled here into
one discriminated union, so a new domain needs no edit outside its own module.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter, ValidationError

from controlplane.commands.base import CommandBase
from controlplane.commands.refused import refused_command
from controlplane.discovery import domain_modules
from events.model import RecordedEvent

COMMAND_TYPES: dict[str, type[CommandBase]] = {
    command.model_fields["type"].default: command
    for domain in domain_modules(sys.modules[__name__], "COMMANDS")
    for command in domain.COMMANDS
}
Command = Annotated[Union[tuple(COMMAND_TYPES.values())], Field(discriminator="type")]  # type: ignore[valid-type]  # noqa: UP007
command_adapter: TypeAdapter[CommandBase] = TypeAdapter(Command)  # type: ignore[arg-type]


def parse_command(payload: dict[str, Any]) -> CommandBase:
    """Rebuild a recorded command from its inbox payload."""
    return command_adapter.validate_python(payload)


def parse_recorded(accepted: RecordedEvent) -> CommandBase:
    """The command `accepted` (a `CommandAccepted` event) recorded, parsed by today's rules; a
    `RefusedCommand` (rejected when decided) where an upgrade tightened them and they refuse
    it. KeyError when the event holds no command."""
    try:
        return parse_command(accepted.data["command"])
    except ValidationError as error:
        return refused_command(accepted, error)


__all__ = ["COMMAND_TYPES", "CommandBase", "command_adapter", "parse_command", "parse_recorded"]
