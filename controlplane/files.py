"""Files read and written for the user: reads bounded, outputs checked before any work."""

from __future__ import annotations

import json
import os
from pathlib import Path

from controlplane.errors import InputError


def read_at_most(path: Path, limit_bytes: int, label: str = "") -> bytes:
    """The bytes of `path`, reading no more than `limit_bytes` + 1 of them (a FIFO or /dev/zero
    never ends); InputError naming the file (after `label`, say "policy file ") when it cannot
    be read or holds more."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(limit_bytes + 1)
    except OSError as error:
        raise InputError(f"cannot read {label}{path}: {error.strerror}") from None
    if len(raw) > limit_bytes:
        raise InputError(f"{label}{path} is larger than {limit_bytes} bytes")
    return raw


class DuplicateKey(ValueError):
    """A JSON object names one key twice: the standard library keeps the last silently, so a
    user's first value would be dropped without a word."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} appears twice in one object")


def unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """`json.loads`' `object_pairs_hook` that refuses an object naming a key twice."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return value


def loads_strict(text: str) -> object:
    """`json.loads`, refusing an object that names a key twice (`DuplicateKey`)."""
    return json.loads(text, object_pairs_hook=unique_keys)


def read_json(path: Path, limit_bytes: int, label: str = "") -> object:
    """The JSON value in `path` (read as `read_at_most`); InputError naming the file and what is
    wrong when it is not UTF-8 JSON that Python can hold, or an object in it names a key twice."""
    raw = read_at_most(path, limit_bytes, label)
    try:
        value = loads_strict(raw.decode("utf-8"))
        # A `\ud800` escape loads as a lone surrogate, which no UTF-8 text (the log's, a
        # digest's) can hold: refused here, not where it is first encoded.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return value
    except UnicodeEncodeError:
        raise InputError(f"{label}{path} holds a lone surrogate escape (such as \\ud800), "
                         "which is not text") from None
    except UnicodeDecodeError as error:
        raise InputError(f"{label}{path} is not UTF-8 text: byte {error.start} cannot be "
                         "decoded") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{label}{path} is not JSON: line {error.lineno}: {error.msg}") from None
    except DuplicateKey as error:
        raise InputError(f"{label}{path}: {error}") from None
    except ValueError as error:  # an integer past Python's digit limit, say
        raise InputError(f"{label}{path} is not usable JSON: {str(error).split(';')[0]}") \
            from None
    except RecursionError:
        raise InputError(f"{label}{path} is nested too deeply to be read") from None


def check_writable(path: Path, option: str) -> None:
    """InputError naming `option` unless a file can be written at `path` (nothing is created)."""
    directory = path.parent
    if path.is_dir():
        raise InputError(f"{option} {path} is a directory; name a file")
    if not directory.is_dir():
        raise InputError(f"{option} {path}: the directory {directory} does not exist")
    writable = os.access(path, os.W_OK) if path.exists() else os.access(directory, os.W_OK | os.X_OK)
    if not writable:
        raise InputError(f"{option} {path}: permission denied")


_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
               int: "a number", float: "a number", type(None): "null"}


def json_kind(value: object) -> str:
    """What JSON value `value` is, for an error naming what was found instead."""
    return _JSON_KINDS.get(type(value), type(value).__name__)
