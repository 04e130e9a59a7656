"""The fault harness kills a worker for real: its work horse too, though RQ gives it a group of
its own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from workers.processes import kill_process_tree

# A "worker" that forks a "horse" which, as RQ's does, leaves for a process group of its own.
WORKER = """
import os, sys, time
child = os.fork()
if child == 0:
    os.setpgrp()
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"  # a zombie is dead, awaiting its parent
    except FileNotFoundError:
        return False


def test_a_killed_worker_takes_its_horse_in_its_own_process_group_with_it() -> None:
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE,
                              start_new_session=True)
    assert worker.stdout is not None
    horse = int(worker.stdout.readline())
    try:
        deadline = time.monotonic() + 5
        while os.getpgid(horse) == os.getpgid(worker.pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # the horse has not left its parent's group yet
        assert os.getpgid(horse) != os.getpgid(worker.pid)  # killpg alone would miss it
        kill_process_tree(worker.pid)
        worker.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _alive(horse) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _alive(horse)
    finally:
        for pid in (horse, worker.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
