"""Files the CLI reads and writes for the user: reads bounded, outputs checked before any work."""

from __future__ import annotations

import os
from pathlib import Path

from controlplane.errors import InputError


def read_at_most(path: Path, limit_bytes: int) -> bytes:
    """The bytes of `path`, reading no more than `limit_bytes` + 1 of them (a FIFO or /dev/zero
    never ends); InputError naming the file when it cannot be read or holds more."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(limit_bytes + 1)
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror}") from None
    if len(raw) > limit_bytes:
        raise InputError(f"{path} is larger than {limit_bytes} bytes")
    return raw


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
