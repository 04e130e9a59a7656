"""Trace readers: every request read as written; a bad file names its line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.simulation.traces import MAX_SPAN_SECONDS, TraceError, read_trace

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def _azure(tmp_path: Path, *rows: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(("\r\n".join([HEADER, *rows])).encode())
    return path


def _mooncake(tmp_path: Path, *records: object) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


def test_azure_rows_are_read_with_seven_digit_fractions_and_crlf(tmp_path: Path) -> None:
    path = _azure(tmp_path, "2023-11-16 18:15:46.6805900,374,44",
                  "2023-11-16 18:15:50.9951690,396,109")
    trace = read_trace(path)
    assert trace.kind == "azure" and trace.block_size_tokens is None
    assert [(r.line, r.prompt_tokens, r.output_tokens) for r in trace.requests] == [
        (2, 374, 44), (3, 396, 109)]
    assert trace.requests[1].arrival_seconds == pytest.approx(4.314579, abs=1e-6)
    assert (trace.prompt_tokens, trace.output_tokens) == (770, 153)


def test_limit_reads_only_the_first_requests(tmp_path: Path) -> None:
    path = _azure(tmp_path, *[f"2023-11-16 18:15:4{i}.0000000,{10 + i},5" for i in range(5)])
    trace = read_trace(path, limit=3)
    assert len(trace.requests) == 3 and trace.prompt_tokens == 33


@pytest.mark.parametrize(("row", "field"), [
    ("2023-11-16 18:15:46.6805900,abc,44", "ContextTokens"),
    ("2023-11-16 18:15:46.6805900,374", "expected 3 fields"),
    ("16/11/2023 18:15,374,44", "TIMESTAMP"),
    ("2023-11-16 18:15:46.6805900,374,-4", "GeneratedTokens"),
    ("2023-11-16 18:15:46.6805900,374,0", "generates no tokens"),
])
def test_a_malformed_azure_row_names_its_line_and_field(tmp_path: Path, row: str, field: str) -> None:
    path = _azure(tmp_path, "2023-11-16 18:15:40.0000000,1,1", row)
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    assert raised.value.line == 3 and field in str(raised.value) and raised.value.exit_code == 2


def test_time_running_backwards_is_refused_at_its_line(tmp_path: Path) -> None:
    path = _azure(tmp_path, "2023-11-16 18:15:41.0000000,1,1", "2023-11-16 18:15:40.0000000,1,1")
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    assert raised.value.line == 3


def test_a_wrong_header_missing_file_or_empty_trace_is_refused(tmp_path: Path) -> None:
    wrong = tmp_path / "w.csv"
    wrong.write_text("time,prompt,output\n")
    for path in (wrong, tmp_path / "missing.csv", _azure(tmp_path, name="empty.csv")):
        with pytest.raises(TraceError):
            read_trace(path)


def test_mooncake_rows_carry_their_block_hash_ids(tmp_path: Path) -> None:
    path = _mooncake(tmp_path,
                     {"timestamp": 0, "input_length": 1025, "output_length": 3, "hash_ids": [0, 1, 2]},
                     {"timestamp": 1500, "input_length": 512, "output_length": 1, "hash_ids": [0]})
    trace = read_trace(path)
    assert trace.kind == "mooncake" and trace.block_size_tokens == 512
    assert trace.requests[0].block_hash_ids == (0, 1, 2)
    assert trace.requests[1].arrival_seconds == pytest.approx(1.5)


@pytest.mark.parametrize(("record", "field"), [
    ({"timestamp": 0, "input_length": 1025, "output_length": 3, "hash_ids": [0, 1]}, "hash_ids"),
    ({"timestamp": 0, "input_length": 10, "output_length": 3}, "hash_ids"),
    ({"timestamp": -1, "input_length": 10, "output_length": 3, "hash_ids": [0]}, "timestamp"),
    ({"timestamp": 0, "input_length": 10.5, "output_length": 3, "hash_ids": [0]}, "input_length"),
    ("{not json", "not JSON"),
])
def test_a_malformed_mooncake_line_names_its_line_and_field(tmp_path: Path, record: object,
                                                            field: str) -> None:
    good = {"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [0]}
    path = _mooncake(tmp_path, good, record)
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    assert raised.value.line == 2 and field in str(raised.value)


@pytest.mark.parametrize("stamp_ms", [300_000_000_000_000, 1e20, 1e15])
def test_a_mooncake_time_past_the_year_9000_is_refused_at_its_line(tmp_path: Path,
                                                                   stamp_ms: float) -> None:
    good = {"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [0]}
    path = _mooncake(tmp_path, good, {**good, "timestamp": stamp_ms})
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    assert raised.value.line == 2 and "timestamp" in str(raised.value)


@pytest.mark.parametrize("stamp", ["9999-12-31 23:59:59.9999999", "0001-01-01 00:00:00.0"])
def test_an_azure_time_outside_1970_to_9000_is_refused_at_its_line(tmp_path: Path,
                                                                    stamp: str) -> None:
    path = _azure(tmp_path, f"{stamp},1,1")
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    assert raised.value.line == 2 and "TIMESTAMP" in str(raised.value)


def test_a_trace_spanning_more_than_ten_years_is_refused_at_the_line_past_it(
        tmp_path: Path) -> None:
    ten_years_ms = int(MAX_SPAN_SECONDS * 1000)
    good = {"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [0]}
    assert read_trace(_mooncake(tmp_path, good, {**good, "timestamp": ten_years_ms})) \
        .span_seconds == MAX_SPAN_SECONDS
    path = _mooncake(tmp_path, good, good, {**good, "timestamp": ten_years_ms + 1})
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    assert raised.value.line == 3 and "ten years" in str(raised.value)


@pytest.mark.parametrize(("row", "field"), [
    ("2023-11-16 18:15:46.6805900,1\u00b2,44", "ContextTokens"),  # '1²': isdigit, not int()
    ("2023-11-16 18:15:46.6805900,374,\u0661\u0662", "GeneratedTokens"),  # Arabic-Indic 12
    ("2023-11-16 18:15:46.68059\u00b9,374,44", "TIMESTAMP"),
    ("2023-11-16 18:15:46.\u0661\u0662,374,44", "TIMESTAMP"),
    ("\u0662\u0660\u0662\u0663-11-16 18:15:46.0,374,44", "TIMESTAMP"),  # strptime's \d takes it
])
def test_a_number_in_other_than_ascii_digits_is_refused_naming_its_line_and_field(
        tmp_path: Path, row: str, field: str) -> None:
    path = _azure(tmp_path, "2023-11-16 18:15:40.0000000,1,1", row)
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    assert raised.value.line == 3 and field in str(raised.value) and raised.value.exit_code == 2


@pytest.mark.parametrize("length", ["1\u00b2", "\u0661\u0662"])
def test_a_mooncake_length_in_other_than_ascii_digits_is_refused_naming_its_line_and_field(
        tmp_path: Path, length: str) -> None:
    path = _mooncake(tmp_path, {"timestamp": 0, "input_length": 1, "output_length": 1,
                                "hash_ids": [1]},
                     {"timestamp": 1, "input_length": length, "output_length": 1,
                      "hash_ids": [1]})
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    assert raised.value.line == 2 and "input_length" in str(raised.value)


def test_a_mooncake_line_giving_a_key_twice_is_refused_naming_its_line_and_the_key(
        tmp_path: Path) -> None:
    path = _mooncake(tmp_path, {"timestamp": 0, "input_length": 1, "output_length": 1,
                                "hash_ids": [1]},
                     '{"timestamp": 9, "input_length": 1, "output_length": 1, "hash_ids": [1], '
                     '"timestamp": 1}')
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    assert raised.value.line == 2 and "timestamp" in str(raised.value)
    assert "t.jsonl" in str(raised.value) and raised.value.exit_code == 2


def test_a_trace_starting_with_a_utf8_byte_order_mark_is_read_as_without_it(
        tmp_path: Path) -> None:
    azure = _azure(tmp_path, "2023-11-16 18:15:46.6805900,374,44", name="bom.csv")
    azure.write_bytes(b"\xef\xbb\xbf" + azure.read_bytes())
    assert [(r.line, r.prompt_tokens) for r in read_trace(azure).requests] == [(2, 374)]
    mooncake = _mooncake(tmp_path, {"timestamp": 0, "input_length": 1, "output_length": 1,
                                    "hash_ids": [1]})
    mooncake.write_bytes(b"\xef\xbb\xbf" + mooncake.read_bytes())
    assert read_trace(mooncake).requests[0].block_hash_ids == (1,)
    unsuffixed = tmp_path / "trace"  # told apart by its first line
    unsuffixed.write_bytes(mooncake.read_bytes())
    assert read_trace(unsuffixed).kind == "mooncake"
