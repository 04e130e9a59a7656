"""Typed errors the CLI maps to exit codes: 2 bad input or usage, 3 operational failure."""

from __future__ import annotations

from dataclasses import dataclass


class FleetError(Exception):
    """Base of the control plane's user-facing errors."""

    exit_code = 3


class InputError(FleetError):
    """The user's input is wrong; nothing was written."""

    exit_code = 2


class OperationalError(FleetError):
    """A store or queue is unreachable, or work timed out."""

    exit_code = 3


@dataclass(frozen=True)
class FieldProblem:
    """One problem with one field of one submitted line."""

    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.field}: {self.message}"


class SubmissionRejected(InputError):
    """A submission had at least one bad line; every problem is listed (in line order, a line's
    own in the order found) and nothing was written."""

    def __init__(self, problems: list[FieldProblem]) -> None:
        super().__init__(f"{len(problems)} problem(s) in the submission; nothing was written")
        self.problems = sorted(problems, key=lambda problem: problem.line)
