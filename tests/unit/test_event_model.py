"""The event envelope types: NewEvent's and StreamAppend's written-out constructors are the
dataclass's own."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from events.model import NewEvent, StreamAppend

FIELDS = dataclasses.fields(NewEvent)


def test_a_new_event_takes_its_fields_in_order_with_their_defaults() -> None:
    parameters = list(inspect.signature(NewEvent).parameters.values())
    assert [p.name for p in parameters] == [f.name for f in FIELDS]
    assert [p.default for p in parameters] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in FIELDS]


def test_a_new_event_holds_exactly_the_values_it_was_given() -> None:
    values = {f.name: f"value of {f.name}" for f in FIELDS}
    by_name, by_position = NewEvent(**values), NewEvent(*values.values())
    for event in (by_name, by_position):
        assert vars(event) == values
        assert dataclasses.asdict(event) == values
    assert by_name == by_position


def test_a_new_event_left_at_its_defaults_holds_them() -> None:
    event = NewEvent("id", "Tested", {}, "2026-01-01T00:00:00.000000Z")
    assert vars(event) == {f.name: getattr(event, f.name) for f in FIELDS}
    assert (event.schema_version, event.command_id, event.actor, event.tenant) == (
        1, None, "system", "default")


def test_a_new_event_cannot_be_changed() -> None:
    event = NewEvent("id", "Tested", {}, "2026-01-01T00:00:00.000000Z")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.actor = "someone"  # type: ignore[misc]


APPEND_FIELDS = dataclasses.fields(StreamAppend)


def test_a_stream_append_takes_its_fields_in_order_with_their_defaults() -> None:
    parameters = list(inspect.signature(StreamAppend).parameters.values())
    assert [p.name for p in parameters] == [f.name for f in APPEND_FIELDS]
    assert [p.default for p in parameters] == [
        f.default_factory() if f.default_factory is not dataclasses.MISSING
        else inspect.Parameter.empty for f in APPEND_FIELDS]


def test_a_stream_append_holds_exactly_the_values_it_was_given() -> None:
    values = {f.name: f"value of {f.name}" for f in APPEND_FIELDS}
    by_name, by_position = StreamAppend(**values), StreamAppend(*values.values())
    for append in (by_name, by_position):
        assert vars(append) == values
        assert dataclasses.asdict(append) == values
    assert by_name == by_position
    assert vars(StreamAppend("inbox", None)) == {"stream_id": "inbox", "expected_version": None,
                                                 "events": ()}


def test_a_stream_append_cannot_be_changed() -> None:
    append = StreamAppend("inbox", None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        append.expected_version = 3  # type: ignore[misc]
