"""Readers for the production request traces in `fixtures/traces/` (their PROVENANCE.md says whence).

Two formats, told apart by the file's suffix (else by its first line):
- Azure LLM inference 2023 CSV: header `TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps
  like `2023-11-16 18:17:03.9799600` (7 fractional digits, no zone; read as UTC), sorted.
- Mooncake FAST'25 JSONL: `{"timestamp": ms, "input_length", "output_length", "hash_ids"}`, one
  hash id per 512-token prefix block; equal ids mean reusable prefix KV.

Guarantee: every request is read exactly as written (counts and token totals equal the file's);
a missing file, a malformed row (a number in other than ASCII digits, a JSON line giving a key
twice), time running backwards or a time out of range raises `TraceError` naming the file, the
line and the field, and nothing is simulated. A UTF-8 byte order mark opening the file is skipped
(spreadsheet exports write one).

Time range: every request must fall within 1970-01-01..9000-01-01 (UTC; a Mooncake trace's zero
is anchored at 2025-02-25) and at most ten years (`MAX_SPAN_SECONDS`) after the trace's first
request. The virtual clock runs from the first request's time, so it stays far inside what a
`datetime` can hold (through 9999) and a float can step through at the finest control interval.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controlplane.errors import InputError
from controlplane.files import DuplicateKey, loads_strict

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_BLOCK_TOKENS = 512
# Mooncake timestamps are milliseconds from the trace's own zero; we anchor them at a fixed date.
MOONCAKE_EPOCH_SECONDS = datetime(2025, 2, 25, tzinfo=UTC).timestamp()
MAX_TOKENS = 100_000_000
EARLIEST_EPOCH_SECONDS = 0.0  # 1970-01-01
LATEST_EPOCH_SECONDS = datetime(9000, 1, 1, tzinfo=UTC).timestamp()
MAX_SPAN_SECONDS = 10 * 365 * 86_400.0  # ten years of virtual clock after the first request


class TraceError(InputError):
    """A trace that cannot be read; names the file, the line and the field."""

    def __init__(self, path: Path, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path, self.line = path, line


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: when it arrived (seconds after the first) and its token counts."""

    index: int
    line: int
    arrival_seconds: float
    prompt_tokens: int
    output_tokens: int
    block_hash_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Trace:
    """A whole trace: its requests in arrival order and the absolute time of its first one."""

    path: str
    kind: str  # "azure" or "mooncake"
    start_epoch_seconds: float
    block_size_tokens: int | None
    requests: tuple[TraceRequest, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(request.prompt_tokens for request in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(request.output_tokens for request in self.requests)

    @property
    def span_seconds(self) -> float:
        return self.requests[-1].arrival_seconds if self.requests else 0.0


def read_trace(path: Path | str, limit: int | None = None) -> Trace:
    """Read the first `limit` requests (all when None) of an Azure CSV or Mooncake JSONL trace."""
    path = Path(path)
    if limit is not None and limit <= 0:
        raise TraceError(path, None, "the request limit must be positive")
    if not path.is_file():
        raise TraceError(path, None, "not a regular file (a directory, a device); give a trace "
                         "file" if path.exists() else "no such trace file")
    kind = _kind_of(path)
    rows = _azure_rows(path) if kind == "azure" else _mooncake_rows(path)
    requests: list[TraceRequest] = []
    start: float | None = None
    previous = -math.inf
    for line, moment, prompt, output, hashes in rows:
        if limit is not None and len(requests) >= limit:
            break
        if moment < previous:
            raise TraceError(path, line, "timestamp is earlier than the previous request's")
        previous = moment
        start = moment if start is None else start
        _check_time(path, line, kind, moment, start)
        requests.append(TraceRequest(len(requests), line, moment - start, prompt, output, hashes))
    if not requests:
        raise TraceError(path, None, "the trace holds no requests")
    assert start is not None
    return Trace(str(path), kind, start, MOONCAKE_BLOCK_TOKENS if kind == "mooncake" else None,
                 tuple(requests))


Row = tuple[int, float, int, int, tuple[int, ...] | None]


def _check_time(path: Path, line: int, kind: str, moment: float, start: float) -> None:
    """Refuse a time outside 1970..9000 or more than `MAX_SPAN_SECONDS` after the first."""
    field = "TIMESTAMP" if kind == "azure" else "timestamp"
    if not EARLIEST_EPOCH_SECONDS <= moment < LATEST_EPOCH_SECONDS:
        raise TraceError(path, line, f"{field}: the request's time is outside 1970-01-01..9000-01-01")
    if moment - start > MAX_SPAN_SECONDS:
        raise TraceError(path, line, f"{field}: {moment - start:.0f} s after the trace's first "
                                     f"request; a trace may span at most {MAX_SPAN_SECONDS:.0f} s "
                                     "(ten years)")


def _kind_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "azure"
    if suffix in (".jsonl", ".json"):
        return "mooncake"
    try:
        with path.open(encoding="utf-8-sig") as handle:
            first = handle.readline().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise TraceError(path, None, f"cannot read: {error}") from None
    return "mooncake" if first.startswith("{") else "azure"


def _ascii_digits(text: str) -> bool:
    """Whether `text` is one or more of 0-9: `str.isdigit` also takes '²' (which `int` refuses)
    and other scripts' digits ('١٢', which `int` reads as 12)."""
    return text.isascii() and text.isdigit()


def _tokens(path: Path, line: int, field: str, raw: Any) -> int:
    if isinstance(raw, str):
        text = raw.strip()
        if not _ascii_digits(text):
            raise TraceError(path, line, f"{field}: {raw!r} is not a whole number of tokens")
        value = int(text)
    elif isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    else:
        raise TraceError(path, line, f"{field}: {raw!r} is not a whole number of tokens")
    if not 0 <= value <= MAX_TOKENS:
        raise TraceError(path, line, f"{field}: {value} is outside 0..{MAX_TOKENS}")
    return value


def _azure_time(path: Path, line: int, raw: str) -> float:
    whole, _, fraction = raw.strip().partition(".")
    malformed = TraceError(path, line, f"TIMESTAMP: {raw!r} is not YYYY-MM-DD HH:MM:SS.fffffff")
    if not whole.isascii():  # strptime's digits are any script's ('٢٠٢٣' is read as 2023)
        raise malformed
    try:
        moment = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        raise malformed from None
    if fraction and not _ascii_digits(fraction):
        raise TraceError(path, line, f"TIMESTAMP: {raw!r} has a malformed fraction")
    # Seven fractional digits are more than strptime takes; read them as a decimal fraction.
    return moment.timestamp() + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def _azure_rows(path: Path) -> Iterator[Row]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None or tuple(cell.strip() for cell in header) != AZURE_HEADER:
                raise TraceError(path, 1, f"header must be {','.join(AZURE_HEADER)}")
            for row in reader:
                line = reader.line_num
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != len(AZURE_HEADER):
                    raise TraceError(path, line, f"expected {len(AZURE_HEADER)} fields, got {len(row)}")
                prompt = _tokens(path, line, "ContextTokens", row[1])
                output = _tokens(path, line, "GeneratedTokens", row[2])
                yield line, _azure_time(path, line, row[0]), prompt, _served(path, line, output), None
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise TraceError(path, None, f"cannot read: {error}") from None


def _served(path: Path, line: int, output: int) -> int:
    if output <= 0:
        raise TraceError(path, line, "the request generates no tokens; nothing to serve")
    return output


def _mooncake_rows(path: Path) -> Iterator[Row]:
    try:
        with path.open(encoding="utf-8-sig") as handle:
            for line, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                yield _mooncake_row(path, line, text)
    except (OSError, UnicodeDecodeError) as error:
        raise TraceError(path, None, f"cannot read: {error}") from None


def _mooncake_row(path: Path, line: int, text: str) -> Row:
    try:
        record = loads_strict(text)  # a key given twice is refused: the last would win silently
    except json.JSONDecodeError as error:
        raise TraceError(path, line, f"not JSON: {error.msg}") from None
    except DuplicateKey as error:
        raise TraceError(path, line, str(error)) from None
    except ValueError as error:  # an integer past Python's digit limit, say
        raise TraceError(path, line, f"not usable JSON: {str(error).split(';')[0]}") from None
    except RecursionError:
        raise TraceError(path, line, "nested too deeply") from None
    if not isinstance(record, dict):
        raise TraceError(path, line, "each line must be a JSON object")
    for field in ("timestamp", "input_length", "output_length", "hash_ids"):
        if field not in record:
            raise TraceError(path, line, f"{field}: missing")
    stamp = record["timestamp"]
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp) \
            or stamp < 0:
        raise TraceError(path, line, f"timestamp: {stamp!r} is not a non-negative number of ms")
    prompt = _tokens(path, line, "input_length", record["input_length"])
    output = _served(path, line, _tokens(path, line, "output_length", record["output_length"]))
    hashes = record["hash_ids"]
    if not isinstance(hashes, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in hashes):
        raise TraceError(path, line, "hash_ids: must be a list of non-negative integers")
    if len(hashes) != -(-prompt // MOONCAKE_BLOCK_TOKENS):
        raise TraceError(path, line, f"hash_ids: {len(hashes)} ids for {prompt} tokens; one per "
                                     f"{MOONCAKE_BLOCK_TOKENS}-token block is needed")
    return line, MOONCAKE_EPOCH_SECONDS + stamp / 1000.0, prompt, output, tuple(hashes)
