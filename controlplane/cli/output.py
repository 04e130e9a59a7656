"""The CLI's output layer: the only place that prints results (to stdout)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import click


class ProgressCallback(Protocol):
    """Told how much of the work is done (and, if it changed, of how much)."""

    def __call__(self, done: int, total: int | None = None) -> None: ...


def emit(result: Any, as_json: bool, human: Callable[[Any], str] | None = None,
         indent: int | None = 2) -> None:
    """Print `result` as JSON (indented, or on one line with `indent=None`), or through `human`
    for people."""
    if as_json or human is None:
        click.echo(json.dumps(result, indent=indent, ensure_ascii=False))
    else:
        click.echo(human(result))


def announce(result: Any, as_json: bool, human: Callable[[Any], str] | None = None) -> None:
    """Print `result` as one line (compact JSON, or `human`): a long-running command's start-up
    or summary line, which a reader of stdout takes as soon as it is written."""
    emit(result, as_json, human, indent=None)


def one_line(message: str) -> str:
    """`message` with its lines joined by "; ": a client library's hint on a line of its own
    (libpq's "\n\tIs the server running...") must not break the one-line error contract."""
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def fail(message: str) -> None:
    """One clear line on stderr, never a traceback."""
    click.echo(f"error: {one_line(message)}", err=True)


def is_terminal() -> bool:
    return sys.stdout.isatty()


def stderr_is_terminal() -> bool:
    """Whether progress is shown: only to a person, never into a pipe, a file or --json."""
    return sys.stderr.isatty()


@contextmanager
def progress(label: str, total: int | None = None) -> Iterator[ProgressCallback | None]:
    """A progress bar (done / total, elapsed) on stderr when it is a terminal; None otherwise,
    so the caller's work reports nowhere and stdout and stderr stay as they were."""
    if not stderr_is_terminal():
        yield None
        return
    from rich.console import Console  # imported only when a bar is shown
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    # force_terminal: the one check above decides, not rich's own guess.
    with Progress("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True, force_terminal=True), transient=True) as bar:
        task = bar.add_task(label, total=total)

        def update(done: int, total: int | None = None) -> None:
            if total is None:
                bar.update(task, completed=done)
            else:
                bar.update(task, completed=done, total=total)
        yield update


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True))
             for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    if value is None:
        return "-"
    return str(value)
