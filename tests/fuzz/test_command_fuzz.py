"""Every fuzzed command is decided or refused with a typed error naming its line and field; a
refusal writes nothing. The payloads come from the command models' own JSON schemas."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from controlplane.commands import COMMAND_TYPES, command_adapter
from controlplane.errors import SubmissionRejected
from controlplane.submission import read_submission
from events.store import EventStore
from tests.fuzz.harness import Verdict, decide_or_refuse, embedded_fleet, fresh_ids
from tests.fuzz.strategies import (
    BrokenLine,
    any_command_payloads,
    as_line,
    broken_lines,
    command_payloads,
    fuzz_settings,
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EventStore]:
    """One seeded embedded fleet for the module: state accumulates, as in a real log."""
    with embedded_fleet(tmp_path_factory.mktemp("command-fuzz")) as store:
        yield store


def _validates(payload: dict[str, object]) -> bool:
    try:
        command_adapter.validate_python(payload)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("command_type", sorted(COMMAND_TYPES))
def test_the_schema_strategy_reaches_the_accept_path_of_every_command_type(command_type: str) -> None:
    # Without this, a strategy that only ever produced refusals would make the fuzzing vacuous.
    no_shrinking = settings(fuzz_settings(300), phases=[Phase.generate])
    found = find(command_payloads(command_type), _validates, settings=no_shrinking)
    assert found["type"] == command_type


@pytest.mark.parametrize("command_type", sorted(COMMAND_TYPES))
def test_schema_valid_commands_are_decided_or_refused_naming_line_and_field(
        fleet: EventStore, command_type: str) -> None:
    @fuzz_settings(3)
    @given(st.lists(command_payloads(command_type), min_size=1, max_size=2))
    def check(payloads: list[dict[str, object]]) -> None:
        decide_or_refuse(fleet, "\n".join(as_line(p) for p in fresh_ids(payloads)))

    check()


def _problem_at(refusal: SubmissionRejected, line: int, broken: BrokenLine) -> bool:
    return any(p.line == line and (p.field == broken.field or p.field.startswith(broken.field + "."))
               for p in refusal.problems)


@fuzz_settings(300)
@given(before=st.lists(any_command_payloads(), max_size=1), broken=broken_lines(),
       after=st.lists(any_command_payloads(), max_size=1))
def test_a_command_broken_in_one_place_is_refused_at_its_line_and_field(
        before: list[dict[str, object]], broken: BrokenLine, after: list[dict[str, object]]) -> None:
    lines = [as_line(p) for p in before] + [broken.text] + [as_line(p) for p in after]
    if broken.text.startswith("[") and not before:
        lines.insert(0, as_line({"type": "AssessMemory"}))  # keep it JSON Lines, not one JSON array
    position = lines.index(broken.text) + 1
    try:
        read_submission("\n".join(lines))
    except SubmissionRejected as refusal:
        assert all(1 <= p.line <= len(lines) and p.field for p in refusal.problems)
        if broken.refused and len(refusal.problems) < 50:  # only the first 50 problems are listed
            assert _problem_at(refusal, position, broken), (broken, refusal.problems)
        return
    assert not broken.refused, f"{broken.kind} at {broken.field} was accepted: {broken.text[:300]}"


@fuzz_settings(40)
@given(st.lists(st.one_of(any_command_payloads(), broken_lines()), min_size=1, max_size=4))
def test_mixed_submissions_are_decided_or_refused_and_a_refusal_writes_nothing(
        fleet: EventStore, items: list[dict[str, object] | BrokenLine]) -> None:
    lines = [item.text if isinstance(item, BrokenLine) else as_line(fresh_ids([item])[0])
             for item in items]
    verdict: Verdict = decide_or_refuse(fleet, "\n".join(lines))
    assert verdict.stage in ("parse", "precheck", "decided")


def test_the_seeded_world_lets_fuzzed_commands_reach_their_handlers(tmp_path: Path) -> None:
    # The fuzzed names are drawn from the world's names, so references resolve and handlers run.
    with embedded_fleet(tmp_path) as store:
        verdict = decide_or_refuse(store, "\n".join(as_line(p) for p in [
            {"type": "CordonNode", "command_id": "fuzz-cordon", "node_id": "n2", "reason": "ünïcode"},
            {"type": "Dispatch", "command_id": "fuzz-dispatch", "tenant": "acme", "principal_id": "alice",
             "idempotency_key": "k1", "pointer_name": "acme/assistant", "input": "hello there"},
        ]))
    assert verdict.stage == "decided"
    assert verdict.outcomes["fuzz-cordon"] and verdict.outcomes["fuzz-dispatch"]
