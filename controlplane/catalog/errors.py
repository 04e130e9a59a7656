"""Typed errors of the model and GPU catalog; both are `PolicyInputError`s naming a field."""

from __future__ import annotations

from controlplane.policies.reasons import PolicyInputError


class CatalogError(PolicyInputError):
    """A configuration or catalog entry the catalog cannot read; `code` and `field` are stable."""


class UnknownCatalogIdError(CatalogError):
    """An id that names no catalog entry; `suggestions` holds the closest known ids."""

    def __init__(self, kind: str, requested: str, suggestions: tuple[str, ...]) -> None:
        hint = f"; did you mean: {', '.join(suggestions)}" if suggestions else ""
        super().__init__(f"unknown_{kind}", kind, f"unknown {kind} {requested!r}{hint}")
        self.requested = requested
        self.suggestions = suggestions
