"""Stream versions as of a folded position, in bounded memory, for re-deriving decisions."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection

from events.model import RecordedEvent
from events.store import EventStore
from events.tables import events_table

_VERSION_AT = select(func.max(events_table.c.stream_version)).where(
    events_table.c.stream_id == bindparam("stream_id"),
    events_table.c.position <= bindparam("position"))


class StreamVersions:
    """Each stream's version as of the last folded event, in bounded memory.

    The versions of recently written streams are kept in two generations of at most `limit`
    each; a stream written longer ago is read back from the log, at the folded position. A
    stream the recorded decision appended to needs neither: its version before the decision is
    one below the decision's first event on it (`before`).
    """

    def __init__(self, store: EventStore, limit: int = 50_000) -> None:
        self.store, self.limit = store, limit
        self.young: dict[str, int] = {}
        self.old: dict[str, int] = {}
        self.dropped_any = False
        self.position = 0
        self._connection: Connection | None = None

    def folded(self, event: RecordedEvent) -> None:
        """Record that `event` is folded: its stream is at its version."""
        self.young[event.stream_id] = event.stream_version
        self.position = event.position
        if len(self.young) > self.limit:
            self.dropped_any = self.dropped_any or bool(self.old)
            self.old, self.young = self.young, {}

    def __call__(self, stream_id: str) -> int:
        """The stream's version as of the folded position, 0 for a stream not yet written."""
        version = self.young.get(stream_id)
        if version is None:
            version = self.old.get(stream_id)
        if version is None:
            version = self._read_back(stream_id) if self.dropped_any else 0
        return version

    def before(self, decision: list[RecordedEvent]) -> Callable[[str], int]:
        """Stream versions just before `decision`'s events, which are not folded yet."""
        appended: dict[str, int] = {}
        for event in decision:
            appended.setdefault(event.stream_id, event.stream_version - 1)
        return lambda stream_id: appended[stream_id] if stream_id in appended else self(stream_id)

    def _read_back(self, stream_id: str) -> int:
        if self._connection is None:
            self._connection = self.store.engine.connect()
        found = self._connection.execute(_VERSION_AT, {"stream_id": stream_id,
                                                       "position": self.position}).scalar()
        return int(found or 0)

    def close(self) -> None:
        """Release the connection used to read versions back, if one was opened."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
