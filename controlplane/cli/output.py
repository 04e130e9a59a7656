"""The CLI's output layer: the only place that prints results (to stdout)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click


def emit(result: Any, as_json: bool, human: Callable[[Any], str] | None = None) -> None:
    """Print `result` as JSON, or through `human` for people."""
    if as_json or human is None:
        click.echo(json.dumps(result, indent=2, sort_keys=False, ensure_ascii=False))
    else:
        click.echo(human(result))


def announce(result: Any, as_json: bool, human: Callable[[Any], str] | None = None) -> None:
    """Print `result` as one line (compact JSON, or `human`): a long-running command's start-up
    or summary line, which a reader of stdout takes as soon as it is written."""
    if as_json or human is None:
        click.echo(json.dumps(result, ensure_ascii=False))
    else:
        click.echo(human(result))


def fail(message: str) -> None:
    """One clear line on stderr, never a traceback."""
    click.echo(f"error: {message}", err=True)


def is_terminal() -> bool:
    return sys.stdout.isatty()


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
