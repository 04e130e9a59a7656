"""Every JSON log line is one parseable object, whatever values a caller passes."""

from __future__ import annotations

import json
from pathlib import Path

from controlplane.logging import json_line


def test_a_log_line_is_sorted_json_and_odd_values_become_their_repr() -> None:
    line = json_line({"event": "x", "b": {2: "two"}, "a": {1, 2}, "path": Path("/tmp")})
    assert list(json.loads(line)) == ["a", "b", "event", "path"]
    assert json.loads(line)["b"] == {"2": "two"} and json.loads(line)["path"] == "PosixPath('/tmp')"


def test_an_integer_beyond_64_bits_is_still_written_exactly() -> None:
    assert json.loads(json_line({"event": "x", "n": 2**80}))["n"] == 2**80


def test_a_huge_integer_beside_keys_of_mixed_types_still_gives_one_json_line() -> None:
    assert json.loads(json_line({"event": "x", 1: 2**80}))["1"] == 2**80


def test_a_librarys_error_with_its_traceback_is_one_json_line_naming_the_exception() -> None:
    """RQ logs a failed job at ERROR with its traceback: a worker's stderr had sixty plain
    text lines in the middle of its JSON log for each one."""
    import subprocess
    import sys

    script = ("import logging\n"
              "from controlplane.logging import configure_logging\n"
              "configure_logging('WARNING')\n"
              "try:\n    1 / 0\nexcept ZeroDivisionError:\n"
              "    logging.getLogger('rq.worker').error('job j: raised\\nwhile executing',"
              " exc_info=True)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    [line] = done.stderr.splitlines()
    record = json.loads(line)
    assert record["event"] == "job j: raised while executing"
    assert (record["level"], record["logger"]) == ("error", "rq.worker")
    assert record["exception"] == "ZeroDivisionError: division by zero"


def test_a_traceback_written_into_the_message_is_cut_and_its_exception_kept() -> None:
    """RQ writes a failed job's traceback into the message text itself (no exc_info): every
    file path and frame ended up in `event`."""
    import logging

    from controlplane.logging import LineFormatter

    message = ("[Job j]: exception raised while executing (decide_commands)\n"
               "Traceback (most recent call last):\n  File \"/x/jobs.py\", line 3, in f\n"
               "    raise TypeError(bad)\nTypeError: command ids must be strings\n")
    record = logging.LogRecord("rq.worker", logging.ERROR, __file__, 1, message, None, None)
    line = json.loads(LineFormatter(as_json=True).format(record))
    assert line["event"] == "[Job j]: exception raised while executing (decide_commands)"
    assert line["exception"] == "TypeError: command ids must be strings"
    plain = LineFormatter(as_json=False).format(record)
    assert plain == ("ERROR rq.worker: [Job j]: exception raised while executing "
                     "(decide_commands) (TypeError: command ids must be strings)")
