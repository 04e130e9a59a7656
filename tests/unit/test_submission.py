"""Bad input is refused with the line and field named, and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.errors import InputError, SubmissionRejected
from controlplane.policy_book import load_overrides
from controlplane.submission import parse_submission
from tests.factories import assess_memory


def lines(*commands: object) -> str:
    return "\n".join(c if isinstance(c, str) else json.dumps(c) for c in commands)


def problems_of(text: str) -> list[tuple[int, str]]:
    with pytest.raises(SubmissionRejected) as raised:
        parse_submission(text)
    return [(p.line, p.field) for p in raised.value.problems]


def test_valid_json_lines_and_json_arrays_parse_alike() -> None:
    first, second = assess_memory("a"), assess_memory("b")
    from_lines = parse_submission(lines(first, second))
    from_array = parse_submission(json.dumps([first, second]))
    assert [c.payload() for c in from_lines] == [c.payload() for c in from_array]


def test_one_malformed_line_among_valid_ones_names_its_line_and_field() -> None:
    bad = assess_memory("b")
    bad["deployment"]["target_concurrency"] = "eight"
    assert problems_of(lines(assess_memory("a"), bad, assess_memory("c"))) == [
        (2, "deployment.target_concurrency")]


def test_a_line_that_is_not_json_is_named() -> None:
    assert problems_of(lines(assess_memory("a"), "{not json")) == [(2, "(json)")]


def test_problems_are_listed_in_line_order_whichever_pass_found_them() -> None:
    # Lines that were not JSON came first, then the fields: 4, 6, 2, 3, 3, 5.
    bad = assess_memory("b")
    bad["deployment"]["target_concurrency"] = "eight"
    found = problems_of(lines(assess_memory("a"), bad, "{not json", bad, "[1"))
    assert [line for line, _ in found] == [2, 3, 4, 5]


def test_one_command_written_over_several_lines_is_read_as_that_command() -> None:
    command = assess_memory("a")
    pretty = json.dumps(command, indent=2)
    assert [c.payload() for c in parse_submission("\n" + pretty + "\n")] == \
        [c.payload() for c in parse_submission(json.dumps(command))]


def test_a_problem_in_a_command_written_over_several_lines_is_named_once() -> None:
    # Read line by line, every line had been "not JSON" and the real problem never shown.
    bad = assess_memory("a")
    bad["deployment"]["target_concurrency"] = "eight"
    assert problems_of("\n\n" + json.dumps(bad, indent=2)) == [
        (3, "deployment.target_concurrency")]


def test_lines_that_are_not_one_json_object_are_still_read_as_json_lines() -> None:
    # Two objects, the first over two lines: not one command, so each line is judged alone.
    text = '{"type":\n"AssessMemory"}\n' + json.dumps(assess_memory("b"))
    assert problems_of(text) == [(1, "(json)"), (2, "(json)")]


def test_unknown_fields_are_refused() -> None:
    bad = assess_memory("a")
    bad["model"]["experts"] = 8
    assert problems_of(lines(bad)) == [(1, "model.experts")]


def test_unknown_command_types_are_refused() -> None:
    assert problems_of(lines({"type": "LaunchMissiles", "command_id": "x"}))[0][1] == "type"


@pytest.mark.parametrize("field,value", [
    ("parameters", -5), ("layers", 0), ("head_dim", 1.5), ("kv_heads", True),
    ("parameters", 10**30),
])
def test_negative_fractional_boolean_and_absurd_model_sizes_are_refused(
        field: str, value: object) -> None:
    bad = assess_memory("a")
    bad["model"][field] = value
    assert problems_of(lines(bad)) == [(1, f"model.{field}")]


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(token: str) -> None:
    text = json.dumps(assess_memory("a")).replace('"gpu_memory_gib": 40.0',
                                                   f'"gpu_memory_gib": {token}')
    assert problems_of(text) == [(1, "deployment.gpu_memory_gib")]


def test_oversized_strings_are_refused() -> None:
    bad = assess_memory("a", model_name="m" * 500)
    assert problems_of(lines(bad)) == [(1, "model_name")]


def test_a_usable_fraction_above_one_is_refused() -> None:
    assert problems_of(lines(assess_memory("a", usable_fraction=1.5))) == [
        (1, "deployment.usable_fraction")]


def test_an_empty_submission_is_refused() -> None:
    with pytest.raises(InputError):
        parse_submission("\n\n")


def test_a_commands_cached_time_and_type_follow_a_copy_that_changes_them() -> None:
    (command,) = parse_submission(json.dumps({**assess_memory("a"), "at": "2026-11-30T12:00:00Z"}))
    assert (command.occurred_at, command.command_type) == ("2026-11-30T12:00:00.000000Z",
                                                           "AssessMemory")
    later = command.model_copy(update={"at": command.at.replace(hour=13)})
    assert later.occurred_at == "2026-11-30T13:00:00.000000Z"
    assert command.occurred_at == "2026-11-30T12:00:00.000000Z"
    assert later.payload()["at"] == "2026-11-30T13:00:00Z" and "occurred_at" not in later.payload()
    assert command == parse_submission(json.dumps(command.payload()))[0]  # caches are not fields


def test_every_command_class_names_its_type_once_for_all_its_commands() -> None:
    from controlplane.commands import COMMAND_TYPES

    for type_name, command_class in COMMAND_TYPES.items():
        assert command_class.command_type == type_name
    (command,) = parse_submission(json.dumps(assess_memory("a")))
    assert command.command_type == "AssessMemory"
    assert "command_type" not in vars(command)  # the class's, not computed per command


def register_node(gpus: int) -> dict[str, object]:
    return {"type": "RegisterNode", "command_id": "node-big", "node_id": "big",
            "gpus": [{"gpu_id": f"g{i}", "gpu_type": "GB200", "memory_gib": 186.0}
                     for i in range(gpus)]}


def test_a_node_as_large_as_a_plan_may_describe_registers_and_one_gpu_more_is_refused() -> None:
    from controlplane.policies.parallelism import MAX_GPUS_PER_NODE

    # An NVL72 domain (72 GPUs, one node) and the largest node a plan's topology may have.
    for gpus in (72, MAX_GPUS_PER_NODE):
        [node] = parse_submission(lines(register_node(gpus)))
        assert len(node.payload()["gpus"]) == gpus
    assert problems_of(lines(register_node(MAX_GPUS_PER_NODE + 1))) == [(1, "gpus")]


@pytest.mark.parametrize("text", [
    '{"type": "AssessMemory", "command_id": "one", "command_id": "two"}\n',
    '[{"type": "AssessMemory", "command_id": "one", "command_id": "two"}]',
], ids=["json-lines", "array"])
def test_a_key_given_twice_is_refused_not_silently_dropped(text: str) -> None:
    """The standard library keeps the last of two equal keys: the submitter's first id would
    have been dropped without a word."""
    with pytest.raises(SubmissionRejected) as refused:
        parse_submission(text)
    assert [str(p) for p in refused.value.problems] == [
        "line 1: (json): key 'command_id' appears twice in one object"]


def test_a_nested_key_given_twice_is_refused_in_a_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "whatif.json"
    path.write_text('{"memory": {"usable_fraction": 0.8}, "memory": {}}', encoding="utf-8")
    with pytest.raises(InputError, match=r"policy file .*whatif.json: key 'memory' appears "
                                         r"twice in one object"):
        load_overrides(path)
    path.write_text('{"memory": {"usable_fraction": 0.8, "usable_fraction": 0.7}}',
                    encoding="utf-8")
    with pytest.raises(InputError, match="key 'usable_fraction' appears twice"):
        load_overrides(path)
