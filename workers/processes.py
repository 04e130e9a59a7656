"""Killing a worker for real: the worker, its process group and every process it started."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def kill_process_tree(pid: int) -> None:
    """SIGKILL process `pid`, its process group and every process descended from it.

    RQ puts each work horse in a process group of its own (`os.setpgrp`), so killing the
    worker's group alone left the horse running: a job "killed" mid-batch could go on to finish
    (and race the harness's registry check). The group is stopped first, so nothing forks while
    its descendants are read (Linux `/proc`).
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGSTOP)
    tree = descendants(pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Every process descended from `pid` (children first), from Linux `/proc`."""
    found: list[int] = []
    parents = [pid]
    while parents:
        parent = parents.pop()
        children: list[int] = []
        for listing in Path(f"/proc/{parent}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                children.extend(int(child) for child in listing.read_text().split())
        found.extend(children)
        parents.extend(children)
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs on this machine (a zombie, dead and awaiting its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):  # gone, or going as it is read
        return False
