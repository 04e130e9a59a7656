"""What every command shares: the base model, the strict field types and their bounds.

Commands are imperative, immutable and strict: unknown fields, wrong types, negative counts,
NaN or infinity and absurd sizes are refused at the edge, before anything is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator

Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$")]
# A node id names its GPUs as `<node>:<gpu>`: a ":" in it would alias another node's GPU.
NodeId = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/@+-]*$")]
CommandId = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
Count = Annotated[int, Field(strict=True, gt=0)]
NonNegativeFloat = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
PositiveFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(strict=True, gt=0, le=1, allow_inf_nan=False)]

MAX_PARAMETERS = 100_000_000_000_000  # 100 trillion: far past any model, short of overflow tricks
MAX_TOKENS = 100_000_000
MAX_GPU_MEMORY_GIB = 100_000.0


class _once:
    """A value computed on first read and kept in the instance's `__dict__` (which later reads
    find first). `functools.cached_property` does the same, but takes a lock on every first
    read in Python 3.11: a measurable share of accepting a command."""

    def __init__(self, compute: Callable[[Any], str]) -> None:
        self.compute = compute
        self.name = compute.__name__

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False,
                              ignored_types=(_once,))


_CACHED = ("occurred_at",)


def as_utc(value: datetime) -> datetime:
    """`value` in UTC (a naive time is taken as UTC); ValueError, which validation reports
    naming the field, when UTC cannot hold it (year 1 at +01:00 is year 0 in UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the time in UTC falls outside years 1 to 9999") from None


class CommandBase(Frozen):
    """Fields every command carries. `at` is the command's logical time: policies read no clock."""

    # Fields that do not tell two commands under one id apart (`service.accept` compares the
    # rest of those either sets): ones whose meaning another field already pins.
    IDENTITY_IGNORES: ClassVar[frozenset[str]] = frozenset()
    # Fields added after logs were written, left out of the payload while at their default: a
    # command that does not use one records the payload it always did, so the decisions of
    # logs written before it re-derive unchanged (their recorded inputs hold that payload).
    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ()
    # The `type` of every command of this class (see `__pydantic_init_subclass__`).
    command_type: ClassVar[str]

    command_id: CommandId = Field(default_factory=lambda: str(uuid.uuid4()))
    at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    actor: Name = "operator"
    tenant: Name = "default"
    correlation_id: CommandId | None = None

    @field_validator("at")
    @classmethod
    def _aware_utc(cls, value: datetime) -> datetime:
        return as_utc(value)

    # Cached on the instance (a command is immutable); not a field, so the payload, equality
    # and validation never see it. A copy with changed fields drops it (below).
    @_once
    def occurred_at(self) -> str:
        return self.at.isoformat(timespec="microseconds").replace("+00:00", "Z")

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """A command class's `command_type` is its `type` field's default, set once per class:
        computed per command (once accepted, once decided), it had cost a call through
        pydantic's class-level `model_fields` each time."""
        super().__pydantic_init_subclass__(**kwargs)
        field = cls.model_fields.get("type")
        if field is not None:
            cls.command_type = str(field.default)

    def model_copy(self, *, update: Mapping[str, Any] | None = None,
                   deep: bool = False) -> Self:
        """A copy (with `update` applied) that computes its cached values afresh."""
        copied = super().model_copy(update=update, deep=deep)
        for name in _CACHED:
            copied.__dict__.pop(name, None)
        return copied

    def references(self) -> list[tuple[str, str]]:
        """(field, entity key) pairs this command needs to exist, e.g. ("node_id", "node/n1")."""
        return []

    def creates(self) -> list[str]:
        """Entity keys this command brings into being when decided, e.g. "node/n1"."""
        return []

    def payload(self) -> dict[str, Any]:
        """The command as plain JSON data, exactly as it is recorded in the inbox."""
        data = self.model_dump(mode="json")
        for name in self.OMITTED_AT_DEFAULT:
            if data[name] == type(self).model_fields[name].default:
                del data[name]
        return data


