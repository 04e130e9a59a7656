"""Command handlers: command -> read state -> policy -> events, one function per command type.

Domain modules of this package export `HANDLERS` (and optionally `PRECHECKS`, `EFFECTS`,
`OBSERVATIONS`, `READS`, `STREAMS`, `WARMS`; see `handlers/base.py`); this is the one registry that
assembles them.
"""

from __future__ import annotations

import sys

from controlplane.discovery import domain_modules
from controlplane.handlers.base import Effect, Handler, Precheck, Reads, Streams, Warm

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
OBSERVATIONS: frozenset[str] = frozenset(kind for domain in _DOMAINS
                                         for kind in getattr(domain, "OBSERVATIONS", ()))

__all__ = ["EFFECTS", "HANDLERS", "OBSERVATIONS", "PRECHECKS", "READS", "STREAMS", "WARMS",
           "Effect", "Handler", "Precheck", "Reads", "Streams", "Warm"]
