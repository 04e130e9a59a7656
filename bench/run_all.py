"""Run every `bench/*_bench.py` script, one after another, then print every figure they measured.

Run `python bench/run_all.py [--timeout SECONDS] [NAME ...]` (`make bench` runs it). Scripts are
discovered, not listed, so a new benchmark needs no edit here; NAME filters by substring. Each
script runs in its own process with this interpreter, its output passed through, and writes its
figures (`--figures-out`, see `bench.figures.Figure`); the summary lists, for each, our number,
the reference measured in the same run, their ratio and the issue's goal. A script that fails
or outlives the timeout is reported, and the exit code is 1 if any did.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import format_table  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_TIMEOUT_SECONDS = 900.0


def discover(names: Sequence[str]) -> list[Path]:
    """The benchmark scripts in name order, those matching any of `names` when given."""
    scripts = sorted(BENCH_DIR.glob("*_bench.py"))
    return [s for s in scripts if not names or any(name in s.name for name in names)]


def run_script(script: Path, timeout_seconds: float,
               figures_out: Path) -> tuple[int | None, float]:
    """Run one script, its stdout printed as it comes; (exit code or None on timeout, seconds)."""
    started = time.monotonic()
    try:
        completed = subprocess.run([sys.executable, str(script), "--figures-out", str(figures_out)],
                                   cwd=BENCH_DIR.parent, timeout=timeout_seconds, check=False)
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - started
    return completed.returncode, time.monotonic() - started


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="run only scripts whose file name contains one")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS,
                        help="seconds each script may take (default 900)")
    args = parser.parse_args(argv)
    scripts = discover(args.names)
    if not scripts:
        print("no benchmark script matched", file=sys.stderr)
        sys.exit(2)
    summary, figures = [], []
    with tempfile.TemporaryDirectory(prefix="fleet-bench-figures-") as directory:
        for script in scripts:
            print(f"=== {script.name}", flush=True)
            figures_out = Path(directory) / f"{script.stem}.json"
            code, seconds = run_script(script, args.timeout, figures_out)
            status = "timed out" if code is None else "ok" if code == 0 else f"exit {code}"
            summary.append((script.name, status, seconds))
            if figures_out.exists():
                figures += [(script.stem, f) for f in json.loads(figures_out.read_text())]
            print(f"=== {script.name}: {status} in {seconds:.0f}s\n", flush=True)
    for name, status, seconds in summary:
        print(f"{name:<28}{status:>12}{seconds:>8.0f}s")
    if figures:
        print("\nfigures (ours beside the reference measured in the same run):")
        print(figures_table(figures))
    if any(status != "ok" for _, status, _ in summary):
        sys.exit(1)


def figures_table(figures: list[tuple[str, dict[str, Any]]]) -> str:
    rows = []
    for script, f in figures:
        met = "" if f["met"] is None else "met" if f["met"] else "MISSED"
        rows.append([f["figure"], _number(f["ours"]), _number(f["reference"]),
                     f"{f['ratio']:.3g}" if f["ratio"] is not None else "-", f["unit"],
                     f["reference_name"], f["goal"], met, script])
    return format_table(["figure", "ours", "reference", "ratio", "unit", "reference is", "goal",
                         "", "script"], rows)


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


if __name__ == "__main__":
    main()
