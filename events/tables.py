"""The log's tables. Alembic migrations in `migrations/` are the only way the schema changes."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Text, UniqueConstraint, select
from sqlmodel import Field, SQLModel


class EventRow(SQLModel, table=True):
    """One event. `position` is gap-free in commit order; uniqueness is the database's job."""

    __tablename__ = "events"
    __table_args__ = (
        UniqueConstraint("stream_id", "stream_version", name="uq_events_stream_version"),
        UniqueConstraint("event_id", name="uq_events_event_id"),
        Index("ix_events_command_id", "command_id"),
    )

    position: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    # Unbounded: a stream id is as long as the ids a command may name (migration 0002).
    stream_id: str = Field(sa_column=Column(Text, nullable=False))
    stream_version: int
    event_id: str = Field(max_length=36)
    event_type: str = Field(max_length=100)
    schema_version: int
    data: str = Field(sa_column=Column(Text, nullable=False))
    command_id: str | None = Field(default=None, max_length=100)
    causation_id: str | None = Field(default=None, max_length=100)
    correlation_id: str | None = Field(default=None, max_length=100)
    actor: str = Field(max_length=200)
    tenant: str = Field(max_length=200)
    occurred_at: str = Field(max_length=40)
    recorded_at: str = Field(max_length=40)
    prev_hash: str = Field(max_length=64)
    hash: str = Field(max_length=64)


class LogHeadRow(SQLModel, table=True):
    """The single row every append locks: the last position and hash of the chain."""

    __tablename__ = "log_head"

    id: int = Field(primary_key=True)
    position: int = Field(sa_column=Column(BigInteger, nullable=False))
    hash: str = Field(max_length=64)


class ProjectionRow(SQLModel, table=True):
    """A row of a projection: fleet state folded from the log, disposable and rebuildable."""

    __tablename__ = "projections"

    name: str = Field(primary_key=True, max_length=100)
    key: str = Field(sa_column=Column(Text, primary_key=True))
    data: str = Field(sa_column=Column(Text, nullable=False))


events_table = EventRow.__table__  # type: ignore[attr-defined]
log_head_table = LogHeadRow.__table__  # type: ignore[attr-defined]
projections_table = ProjectionRow.__table__  # type: ignore[attr-defined]
# The log head: the last position and hash, read by every transaction.
HEAD = select(log_head_table.c.position, log_head_table.c.hash).where(log_head_table.c.id == 1)
