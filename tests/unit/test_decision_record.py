"""A decision record is plain data the log can store without checking it again."""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Any

import pytest

from controlplane.decisions import DecisionContext, OutsideReads, decision_data
from controlplane.policies.admission import AdmissionAction
from controlplane.policies.reasons import Reason, to_plain
from controlplane.policy_book import PolicyBook, PolicyInForce
from events.canonical import Plain, encode


def _record(**overrides: Any) -> dict[str, Any]:
    ctx = DecisionContext(state=None, read_position=7,  # type: ignore[arg-type]
                          stream_version=lambda _: 0, policies=PolicyBook(),
                          accepted_event_id=None)
    arguments: dict[str, Any] = {
        "outcome": "admit", "reasons": [Reason("fits", "it fits", {"tokens": 10})],
        "result": {"pool": ("a", "b")}, "policy": PolicyInForce("admission", 2, {"x": [1.5]}),
        "inputs": {"queue": ["r1"]}, "ctx": ctx, "causes": ["e1"]}
    return decision_data(**{**arguments, **overrides})


def test_a_decision_record_is_stored_exactly_as_its_plain_copy_would_be() -> None:
    record = _record()
    assert type(record) is Plain
    assert encode(record) == encode(dict(record))


@pytest.mark.parametrize("where", ["reasons", "result", "inputs", "policy"])
def test_a_decision_record_refuses_a_non_finite_number_anywhere(where: str) -> None:
    bad: dict[str, Any] = {
        "reasons": [Reason("r", "m", {"x": math.nan})], "result": {"x": [math.inf]},
        "inputs": {"x": -math.inf}, "policy": PolicyInForce("admission", 1, {"x": math.nan})}
    with pytest.raises(ValueError, match="non-finite"):
        _record(**{where: bad[where]})


def test_a_decision_record_shares_no_container_with_what_it_was_built_from() -> None:
    inputs: dict[str, Any] = {"queue": ["r1"]}
    parameters: dict[str, Any] = {"x": [1.5]}
    causes = ["e1"]
    record = _record(inputs=inputs, policy=PolicyInForce("admission", 2, parameters),
                     causes=causes)
    text = encode(record)[0]
    inputs["queue"].append("r2")
    parameters["x"].append(9.0)
    causes.append("e2")
    assert encode(record)[0] == text


def test_an_enum_outcome_is_recorded_by_its_value() -> None:
    assert _record(outcome=AdmissionAction.ADMIT)["outcome"] == "admit"


def test_a_reasons_facts_are_copied_into_the_record_not_shared() -> None:
    facts: dict[str, Any] = {"tokens": [10], "pool": {"id": "p"}}
    record = _record(reasons=(Reason("fits", "it fits", facts),))
    text = encode(record)[0]
    facts["tokens"].append(11)
    facts["pool"]["id"] = "q"
    facts["added"] = 1
    assert encode(record)[0] == text


def test_a_dataclass_field_holding_a_non_finite_number_is_refused() -> None:
    @dataclass(frozen=True)
    class Measured:
        name: str
        value: float

    assert to_plain(Measured("ok", 1.5)) == {"name": "ok", "value": 1.5}
    with pytest.raises(ValueError, match="non-finite"):
        to_plain(Measured("bad", math.inf))


def test_a_decision_context_takes_its_fields_in_order_with_their_defaults() -> None:
    """Its __init__ is written out (one context per decision): it must stay the dataclass's."""
    fields = dataclasses.fields(DecisionContext)
    parameters = list(inspect.signature(DecisionContext).parameters.values())
    assert [p.name for p in parameters] == [f.name for f in fields]
    for parameter, field in zip(parameters, fields, strict=True):
        if field.default_factory is not dataclasses.MISSING:  # made afresh: see below
            assert parameter.default is not inspect.Parameter.empty
        else:
            assert parameter.default == (inspect.Parameter.empty
                                         if field.default is dataclasses.MISSING else field.default)
    values = {f.name: f"value of {f.name}" for f in fields}
    assert vars(DecisionContext(**values)) == values == vars(DecisionContext(*values.values()))


def test_each_decision_context_reads_outside_the_log_into_its_own_record() -> None:
    first = DecisionContext(None, 1, len, PolicyBook(), None)  # type: ignore[arg-type]
    second = DecisionContext(None, 1, len, PolicyBook(), None)  # type: ignore[arg-type]
    assert first.outside == OutsideReads() and first.outside is not second.outside
    assert (first.rules_version, first.recorded_at) == (1, None)
    again = dataclasses.replace(first, rules_version=2)
    assert again.outside is first.outside and again.rules_version == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.rules_version = 3  # type: ignore[misc]
