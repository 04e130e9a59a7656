"""Command handlers: command -> read state -> policy -> events, one function per command type.

Domain modules of this package export `HANDLERS` (and optionally `PRECHECKS`, `EFFECTS`,
`OBSERVATIONS`, `READS`, `RULES_VERSIONS`, `STREAMS`, `WARMS`; see `handlers/base.py`); this is
the one registry that assembles them.
"""

from __future__ import annotations

import dataclasses
import sys

import structlog

from controlplane.commands import CommandBase
from controlplane.decisions import (
    DECISION_FAILURES,
    MAX_FAILURE_DETAIL,
    DecisionContext,
    failed_decision,
)
from controlplane.discovery import domain_modules
from controlplane.handlers.base import (
    Effect,
    Handler,
    Precheck,
    Reads,
    Streams,
    Unfinished,
    Warm,
)
from events.model import StreamAppend

log = structlog.get_logger(__name__)

_DOMAINS = domain_modules(sys.modules[__name__], "HANDLERS")
HANDLERS: dict[str, Handler] = {name: handler for domain in _DOMAINS
                                for name, handler in domain.HANDLERS.items()}
PRECHECKS: dict[str, Precheck] = {name: check for domain in _DOMAINS
                                  for name, check in getattr(domain, "PRECHECKS", {}).items()}
EFFECTS: dict[str, Effect] = {name: effect for domain in _DOMAINS
                              for name, effect in getattr(domain, "EFFECTS", {}).items()}
READS: dict[str, Reads] = {name: reads for domain in _DOMAINS
                           for name, reads in getattr(domain, "READS", {}).items()}
STREAMS: dict[str, Streams] = {name: streams for domain in _DOMAINS
                               for name, streams in getattr(domain, "STREAMS", {}).items()}
WARMS: dict[str, Warm] = {name: warm for domain in _DOMAINS
                          for name, warm in getattr(domain, "WARMS", {}).items()}
RULES_VERSIONS: dict[str, int] = {name: version for domain in _DOMAINS
                                  for name, version in getattr(domain, "RULES_VERSIONS", {}).items()}
OBSERVATIONS: frozenset[str] = frozenset(kind for domain in _DOMAINS
                                         for kind in getattr(domain, "OBSERVATIONS", ()))
RESUMABLE: frozenset[str] = frozenset(kind for domain in _DOMAINS
                                      for kind in getattr(domain, "RESUMABLE", ()))
UNFINISHED: list[Unfinished] = [find for domain in _DOMAINS
                                for find in getattr(domain, "UNFINISHED", ())]



def rules_version(command_type: str) -> int:
    """The version of `command_type`'s decision rules today (`RULES_VERSIONS`, else 1)."""
    return RULES_VERSIONS.get(command_type, 1)


def decide_command(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """The command's decision by its handler; the one way both deciding and re-derivation
    call handlers. The decision records the version of the rules it was made under.

    A handler that raises one of `DECISION_FAILURES` (a bug, or inputs its policy does not
    guard against) gets its command rejected with `decision_failed` (`failed_decision`)
    instead of failing, and rolling back, every other command of its batch on every retry.
    """
    version = rules_version(command.command_type)
    if version != ctx.rules_version:
        ctx = dataclasses.replace(ctx, rules_version=version)
    try:
        return HANDLERS[command.command_type](command, ctx)
    except DECISION_FAILURES as error:
        # No traceback: its locals would carry the command's inputs into the logs.
        log.error("decision_failed", command_id=command.command_id,
                  command_type=command.command_type, error=type(error).__name__,
                  detail=str(error)[:MAX_FAILURE_DETAIL])
        return failed_decision(command, ctx, error)


__all__ = ["EFFECTS", "HANDLERS", "OBSERVATIONS", "PRECHECKS", "READS", "RESUMABLE",
           "RULES_VERSIONS", "STREAMS", "UNFINISHED", "WARMS",
           "Effect", "Handler", "Precheck", "Reads", "Streams", "Warm", "decide_command",
           "rules_version"]
