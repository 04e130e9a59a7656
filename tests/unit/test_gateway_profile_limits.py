"""A profile's limits must leave some request room in its context window (spec §5.1 step 5)."""

from __future__ import annotations

import json

import pytest

from controlplane.errors import SubmissionRejected
from controlplane.submission import parse_submission


def profile(**limits: int) -> str:
    return json.dumps({"type": "RegisterProfile", "profile_id": "p", "model_id": "m",
                       "digest": "sha256:p", "approved": True, **limits})


@pytest.mark.parametrize(("limits", "fields"), [
    ({"context_window_tokens": 100, "max_output_tokens": 5_000, "input_limit_tokens": 9_000},
     ["max_output_tokens", "input_limit_tokens"]),
    ({"context_window_tokens": 100, "max_output_tokens": 100}, ["max_output_tokens"]),
    ({"context_window_tokens": 100, "max_output_tokens": 10, "input_limit_tokens": 100},
     ["input_limit_tokens"]),
], ids=["both_above_the_window", "output_fills_the_window", "input_fills_the_window"])
def test_a_profile_whose_limits_leave_no_room_in_its_context_window_is_refused_naming_the_field(
        limits: dict[str, int], fields: list[str]) -> None:
    with pytest.raises(SubmissionRejected) as refused:
        parse_submission(profile(**limits))
    assert [(p.line, p.field) for p in refused.value.problems] == [(1, f) for f in fields]


def test_a_profile_whose_limits_fit_its_context_window_is_accepted() -> None:
    [command] = parse_submission(profile(context_window_tokens=100, max_output_tokens=99,
                                         input_limit_tokens=99))
    assert command.command_type == "RegisterProfile"


def test_an_invalid_context_window_is_named_alone() -> None:
    with pytest.raises(SubmissionRejected) as refused:
        parse_submission(profile(context_window_tokens=0, max_output_tokens=10))
    assert [p.field for p in refused.value.problems] == ["context_window_tokens"]
