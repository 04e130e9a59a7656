"""Parse and validate a submission (JSON Lines, a JSON array, or one command written over
several lines): all of it, or none of it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from controlplane.commands import CommandBase, command_adapter
from controlplane.errors import FieldProblem, InputError, SubmissionRejected
from controlplane.files import DuplicateKey, loads_strict

MAX_SUBMISSION_BYTES = 256 * 1024 * 1024
# One command, as a JSON line or an array item; room for the gateway's largest input field.
MAX_COMMAND_BYTES = 8 * 1024 * 1024
MAX_LINE_BYTES = MAX_COMMAND_BYTES
MAX_COMMANDS = 1_000_000
MAX_PROBLEMS_LISTED = 50


def _unparseable(error: Exception) -> str:
    if isinstance(error, RecursionError):
        return "nested too deeply"
    if isinstance(error, DuplicateKey):
        return str(error)
    return f"not usable JSON: {str(error).split(';')[0]}"


def _field_name(location: tuple[Any, ...]) -> str:
    # The discriminator tag pydantic inserts ("AssessMemory") is not a field the user wrote.
    parts = [str(part) for part in location]
    if len(parts) > 1 and parts[0][:1].isupper():
        parts = parts[1:]
    return ".".join(parts) or "(command)"


def _validate(item: Any, line: int, problems: list[FieldProblem]) -> CommandBase | None:
    if not isinstance(item, dict):
        problems.append(FieldProblem(line, "(command)", "a command must be a JSON object"))
        return None
    if "type" not in item:
        problems.append(FieldProblem(line, "type", "missing: every command names its type"))
        return None
    try:
        return command_adapter.validate_python(item)
    except ValidationError as error:
        for detail in error.errors(include_url=False):
            field = "type" if detail["type"] == "union_tag_invalid" else _field_name(detail["loc"])
            problems.append(FieldProblem(line, field, detail["msg"]))
        return None


def _one_object_over_lines(text: str) -> tuple[int, Any] | None:
    """A pretty-printed command (one JSON object over several lines) with the line it starts
    on, or None when `text` is not that (JSON Lines, read line by line). Read line by line, it
    had been a "not JSON" problem on every line, the command's own problems never shown."""
    first, _, rest = text.lstrip("\n").partition("\n")
    if not rest.strip() or len(text.encode("utf-8", errors="surrogatepass")) > MAX_COMMAND_BYTES:
        return None
    try:
        loads_strict(first)
        return None  # the first line is a whole JSON value: JSON Lines
    except (ValueError, RecursionError):
        pass
    try:
        value = loads_strict(text)
    except (ValueError, RecursionError):
        return None
    return (len(text) - len(text.lstrip("\n")) + 1, value) if isinstance(value, dict) else None


@dataclass(frozen=True)
class Submission:
    """Validated commands and the line (or array item) each came from."""

    commands: list[CommandBase]
    lines: list[int]


def parse_submission(text: str) -> list[CommandBase]:
    """Every command in `text`, validated; raises SubmissionRejected listing each bad line."""
    return read_submission(text).commands


def read_submission(text: str) -> Submission:
    """Like `parse_submission`, keeping each command's line number for later problems."""
    if len(text.encode("utf-8", errors="replace")) > MAX_SUBMISSION_BYTES:
        raise InputError(f"submission is larger than {MAX_SUBMISSION_BYTES} bytes")
    stripped = text.lstrip()
    problems: list[FieldProblem] = []
    items: list[tuple[int, Any]] = []
    if stripped.startswith("["):
        try:
            array = loads_strict(text)
        except json.JSONDecodeError as error:
            raise SubmissionRejected([FieldProblem(error.lineno, "(json)", error.msg)]) from None
        except (ValueError, RecursionError) as error:
            raise SubmissionRejected([FieldProblem(1, "(json)", _unparseable(error))]) from None
        if not isinstance(array, list):
            raise SubmissionRejected([FieldProblem(1, "(json)", "expected a JSON array")])
        for index, item in enumerate(array):
            if len(json.dumps(item, ensure_ascii=False).encode("utf-8")) > MAX_COMMAND_BYTES:
                problems.append(FieldProblem(index + 1, "(command)",
                                             f"larger than {MAX_COMMAND_BYTES} bytes"))
            else:
                items.append((index + 1, item))
    elif stripped.startswith("{") and (whole := _one_object_over_lines(text)) is not None:
        items.append(whole)
    else:
        # Only "\n" ends a line: U+2028 and friends are legal inside JSON strings.
        for number, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            if len(line.encode("utf-8", errors="surrogatepass")) > MAX_LINE_BYTES:
                problems.append(FieldProblem(number, "(line)", f"longer than {MAX_LINE_BYTES} bytes"))
                continue
            try:
                items.append((number, loads_strict(line)))
            except json.JSONDecodeError as error:
                problems.append(FieldProblem(number, "(json)", f"not JSON: {error.msg}"))
            except (ValueError, RecursionError) as error:
                problems.append(FieldProblem(number, "(json)", _unparseable(error)))
    if len(items) > MAX_COMMANDS:
        raise InputError(f"submission holds {len(items)} commands; the limit is {MAX_COMMANDS}")
    commands: list[CommandBase] = []
    line_numbers: list[int] = []
    for number, item in items:
        command = _validate(item, number, problems)
        if command is not None:
            commands.append(command)
            line_numbers.append(number)
    if problems:
        # The first lines' problems, whichever pass found them.
        raise SubmissionRejected(sorted(problems, key=lambda p: p.line)[:MAX_PROBLEMS_LISTED])
    if not commands:
        raise InputError("the submission holds no commands")
    return Submission(commands, line_numbers)
