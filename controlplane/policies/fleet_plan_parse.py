"""Plain JSON data to a `Scenario` (or any plan dataclass), refusing anything malformed with the
offending field's path.

The parser is driven by the dataclasses' own type hints, so the JSON shape is exactly what
`to_plain(value)` produces and the round trip is the identity: fields are named as in the
dataclasses, omitted fields take their declared defaults, unknown fields are refused, integers
must be integers, numbers must be finite, and a number given for a float field becomes a float
(so `40` and `40.0` bind to the same digest).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, fields, is_dataclass
from enum import Enum
from functools import cache
from types import UnionType
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from controlplane.policies.admission import AdmissionAction
from controlplane.policies.fleet_plan_scenario import (
    CONTROL_EVIDENCE,
    EVIDENCE_SOURCES,
    ObservedAt,
    Scenario,
)
from controlplane.policies.placement import validate_inventory
from controlplane.policies.reasons import PolicyInputError, require

_OVERRIDE_ACTIONS = (AdmissionAction.ADMIT, AdmissionAction.QUEUE, AdmissionAction.SHED)
_T = TypeVar("_T")


def from_plain(cls: type[_T], plain: object, path: str = "") -> _T:
    """Rebuild a dataclass from its `to_plain` form; the round trip is the identity on plain data.

    Malformed data raises PolicyInputError naming the field; no rule beyond the shape is checked.
    """
    value = _parse(plain, cls, path)
    assert isinstance(value, cls)
    return value


def parse_scenario_structure(plain: object) -> Scenario:
    """Build a scenario from plain data and check its own rules; policy ranges are not checked."""
    scenario = from_plain(Scenario, plain)
    check_scenario(scenario)
    return scenario


def _sorted_keys(value: object) -> object:
    if isinstance(value, Mapping):
        return {key: _sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(item) for item in value]
    return value


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _parse(value: object, hint: Any, path: str) -> Any:
    if hint is Any:
        # Reason facts: plain data already. Key order is not part of their meaning, and a log
        # stores them sorted, so they are rebuilt sorted: fresh and recorded results then match.
        return _sorted_keys(value)
    if isinstance(hint, type) and is_dataclass(hint):
        return _parse_dataclass(value, hint, path)
    origin = get_origin(hint)
    if origin in (UnionType, Union):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        (inner,) = [option for option in options if option is not type(None)]
        return _parse(value, inner, path)
    if origin in (tuple, frozenset):
        require(isinstance(value, list), "wrong_type", path, f"{path} must be a list")
        assert isinstance(value, list)
        items = [_parse(item, get_args(hint)[0], f"{path}[{index}]")
                 for index, item in enumerate(value)]
        if origin is tuple:
            return tuple(items)
        require(len(set(items)) == len(items), "duplicate_entry", path,
                f"{path} lists an entry twice")
        return frozenset(items)
    if origin in (Mapping, dict):
        where = path or "value"
        require(isinstance(value, Mapping) and all(isinstance(key, str) for key in value),
                "not_an_object", where, f"{where} must be an object with string keys")
        assert isinstance(value, Mapping)
        if get_args(hint)[1] is Any:
            return _sorted_keys(value)
        return {key: _parse(item, get_args(hint)[1], _join(path, key))
                for key, item in value.items()}
    if isinstance(hint, type) and issubclass(hint, Enum):
        choices = [member.value for member in hint]
        require(isinstance(value, str) and value in choices, "invalid_choice", path,
                f"{path} must be one of {', '.join(choices)}")
        return hint(value)
    return _parse_scalar(value, hint, path)


def _parse_scalar(value: object, hint: Any, path: str) -> Any:
    if hint is bool:
        require(isinstance(value, bool), "wrong_type", path, f"{path} must be true or false")
        return value
    if hint is str:
        require(isinstance(value, str), "wrong_type", path, f"{path} must be a string")
        return value
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        require(is_number and isinstance(value, int), "wrong_type", path,
                f"{path} must be an integer")
        return value
    if hint is float:
        require(is_number, "wrong_type", path, f"{path} must be a number")
        assert isinstance(value, (int, float))
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        require(math.isfinite(number), "not_finite", path, f"{path} must be a finite number")
        # Deliberately a float even for an integer (`4` and `4.0` are one input and bind one
        # digest), so the plan prints `"overhead_gib_per_gpu": 4.0` where spec §2.4's text,
        # echoing the reference's int, has `4`: the same figure.
        return number
    raise TypeError(f"the scenario parser does not support {hint!r} at {path}")


def _parse_dataclass(value: object, cls: type, path: str) -> Any:
    where = path or "scenario"
    require(isinstance(value, Mapping), "not_an_object", where, f"{where} must be an object")
    assert isinstance(value, Mapping)
    declared = {item.name: item for item in fields(cls)}
    for key in value:
        require(isinstance(key, str) and key in declared, "unknown_field", _join(path, str(key)),
                f"{_join(path, str(key))} is not a field of {cls.__name__}")
    hints = _hints(cls)
    arguments: dict[str, Any] = {}
    for name, declaration in declared.items():
        if name in value:
            arguments[name] = _parse(value[name], hints[name], _join(path, name))
        else:
            has_default = (declaration.default is not MISSING
                           or declaration.default_factory is not MISSING)
            require(has_default, "missing_field", _join(path, name),
                    f"{_join(path, name)} is required")
    return cls(**arguments)


def _finite_time(value: float, path: str) -> None:
    require(isinstance(value, (int, float)) and math.isfinite(value), "time_not_finite", path,
            f"{path} must be a finite time")


def check_scenario(scenario: Scenario) -> None:
    """Refuse a scenario whose own rules fail: blank name, required evidence below the control
    floor, evidence from the future or with no usable age, clashing probes, stray overrides, an
    inventory placement could not trust (checked here, not only when the placement stage runs:
    whether bad input is refused must not depend on the layout the plan computes)."""
    validate_inventory(scenario.inventory)
    require(bool(scenario.name.strip()), "scenario_name_required", "name",
            "the scenario must be named")
    require(all(item.strip() for item in scenario.required_evidence), "evidence_name_blank",
            "required_evidence", "required evidence names may not be blank")
    missing = sorted(set(CONTROL_EVIDENCE) - scenario.required_evidence)
    require(not missing, "required_evidence_below_policy_floor", "required_evidence",
            f"required evidence must include every control; missing {', '.join(missing)}")
    _finite_time(scenario.evaluated_at_seconds, "evaluated_at_seconds")
    for source in EVIDENCE_SOURCES:
        observed: ObservedAt = getattr(scenario.evidence_times, source)
        where = f"evidence_times.{source}"
        _finite_time(observed.observed_at_seconds, f"{where}.observed_at_seconds")
        require(observed.observed_at_seconds <= scenario.evaluated_at_seconds,
                "evidence_from_the_future", f"{where}.observed_at_seconds",
                f"{source} evidence is dated after the evaluation time")
        # Both times are finite, yet the age the grade reports can still overflow.
        require(math.isfinite(scenario.evaluated_at_seconds - observed.observed_at_seconds),
                "evidence_age_not_finite", f"{where}.observed_at_seconds",
                f"{source} evidence's age at evaluated_at_seconds is out of numeric range")
        age = observed.max_age_seconds
        require(isinstance(age, (int, float)) and math.isfinite(age) and age > 0,
                "evidence_max_age_not_positive", f"{where}.max_age_seconds",
                f"{source} evidence needs a positive, finite maximum age")
    probe_ids = (scenario.benign_probe.request.identifier,
                 scenario.oversize_probe.request.identifier)
    require(probe_ids[0] != probe_ids[1], "admission_probe_ids_not_distinct",
            "oversize_probe.request.identifier", "the two admission probes need distinct ids")
    seen: set[str] = set()
    for index, override in enumerate(scenario.test_stimulus_admission_overrides):
        where = f"test_stimulus_admission_overrides[{index}]"
        require(override.request_id in probe_ids, "admission_override_unknown_request",
                f"{where}.request_id", "an override must name one of the admission probes")
        require(override.request_id not in seen, "duplicate_entry", f"{where}.request_id",
                "a probe may be overridden once")
        seen.add(override.request_id)
        require(override.action in _OVERRIDE_ACTIONS, "admission_override_action_invalid",
                f"{where}.action", "an override may only admit, queue or shed")
        require(isinstance(override.reserved_tokens, int) and override.reserved_tokens >= 0,
                "admission_override_tokens_negative", f"{where}.reserved_tokens",
                "reserved tokens may not be negative")
        require(bool(override.note.strip()), "admission_override_note_required",
                f"{where}.note", "a test stimulus must say why it exists")


def relocate_error(error: PolicyInputError, sections: tuple[tuple[object, str], ...]
                   ) -> PolicyInputError:
    """The same error with its field re-rooted at the scenario section that supplied it.

    Each section is (a field-path prefix the policy uses, or the input dataclass whose field it
    names, the scenario path); the first that matches wins, and an unmatched field is kept.
    """
    head = error.field.split(".")[0].split("[")[0]
    for source, target in sections:
        if isinstance(source, str):
            if error.field == source or error.field.startswith((f"{source}.", f"{source}[")):
                field = target + error.field[len(source):]
                return PolicyInputError(error.code, field, error.message)
        elif isinstance(source, type) and head in {item.name for item in fields(source)}:
            return PolicyInputError(error.code, _join(target, error.field), error.message)
    return error
