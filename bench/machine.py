"""What the machine was doing during a benchmark: its load, and how many of its cores were busy.

On a shared machine every row of a run slows together; these say how busy it was.
"""

from __future__ import annotations

import os


def load_average() -> str:
    """The 1-minute load average: a busy machine slows every row, so the output shows it."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"


def cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) CPU time of the whole machine so far, from /proc/stat (None elsewhere)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            # user nice system idle iowait irq softirq steal; guest time is inside user and nice.
            fields = [int(value) for value in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def cores_busy(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """How many of the machine's CPUs were busy between two `cpu_jiffies` readings, on average:
    every process counts (workers, the database, Redis, the submitter, and anyone else's)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1)
