"""Replay benchmark: rebuild every projection from the log beside the floor of scanning it.

Run `python bench/replay_bench.py [--requests N | --events N] [--log PATH] [--json]`; the issue's
scale is `--events 1000000`. It decides a seeded mixed fleet workload
(`controlplane.workloads.mixed_fleet`: inventory, placements, admissions and releases, autoscaler
ticks, canaries) into a SQLite log through the ordinary accept and decide path, then measures in
one run, each in its own child process so peak resident memory is its own:
  - floor:   scan the rows and decode their JSON (as the log decodes it, `events.canonical.decode`),
             doing nothing else;
  - rebuild: fold every event into fresh projections (what `fleetctl replay` does), over the
             first quarter of the log and over all of it: equal peaks mean memory is flat
             (once the pool keeps its maximum of settled admission records, 10,000 by
             default, reached after about 60,000 events of this workload);
  - verify:  re-derive every decision (`fleetctl replay --verify`).
`--log PATH` keeps the built log there and reuses it on the next run with the same size, since
building 1,000,000 events takes minutes. Peak memory is the child's own high-water mark
(`VmHWM`), not `ru_maxrss`, which a child inherits from the parent that forked it.
Goals (issue 8): rebuild at least 0.5 of the floor, memory flat in the log size (under 300 MB at
1,000,000 events), verify over 100,000 decisions in under 60 seconds.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    count,
    format_table,
)
from bench.figures import Figure, add_figures_argument, write_figures  # noqa: E402
from bench.machine import load_average  # noqa: E402

EVENTS_PER_REQUEST = 6.0  # measured on mixed_fleet: accept, decide and pool event per admit and release
SEED = 20261130


def build_log(url: str, requests: int) -> tuple[int, int]:
    """Decide the workload into the log at `url`; returns (events, decisions)."""
    from controlplane.commands import command_adapter
    from controlplane.logging import configure_logging
    from controlplane.runtime import open_store
    from controlplane.service import accept, decide, pending_command_ids
    from controlplane.workloads import mixed_fleet

    configure_logging("WARNING")
    store = open_store(url)
    decided = 0
    for phase in mixed_fleet(SEED, requests=requests):
        for start in range(0, len(phase), 2_000):
            accept(store, [command_adapter.validate_python(p) for p in phase[start:start + 2_000]])
            while pending := pending_command_ids(store):
                for offset in range(0, len(pending), 500):
                    decided += len(decide(store, pending[offset:offset + 500]))
    return store.head()[0], decided


def peak_rss_mib() -> float:
    """This process's own peak resident memory (Linux `VmHWM`; `ru_maxrss` elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(url: str, what: str, to_position: int | None) -> dict[str, float | int]:
    """Runs in a child process: one measurement and its peak resident memory."""
    from controlplane.logging import configure_logging
    from controlplane.replay.fold import fold
    from controlplane.replay.verify import verify_decisions
    from controlplane.runtime import open_store
    from events.canonical import decode

    configure_logging("WARNING")
    store = open_store(url)
    started = time.perf_counter()
    count, rows, drifts = 0, 0, 0
    if what == "rebuild":
        state = fold(store.read_all(to_position=to_position))
        rows = sum(len(table) for table in state.tables.values())
        count = to_position if to_position is not None else store.head()[0]
    elif what == "floor":
        for row in store.read_all(to_position=to_position, raw=True):
            decode(row["data"])
            count += 1
    else:
        report = verify_decisions(store, to_position=to_position)
        count, drifts = report.decisions_checked, len(report.drifts)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "count": count, "rows_kept": rows, "drifts": drifts,
            "peak_rss_mib": peak_rss_mib()}


def in_child(url: str, what: str, to_position: int | None = None) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", url, what, str(to_position or 0)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def prepared_log(path: Path, requests: int) -> tuple[int, int, float, bool]:
    """Build the log at `path`, or reuse the one a run with the same size left there."""
    manifest = path.with_suffix(path.suffix + ".json")
    wanted = {"seed": SEED, "requests": requests}
    if path.exists() and manifest.exists():
        recorded = json.loads(manifest.read_text())
        if {k: recorded.get(k) for k in wanted} == wanted:
            return recorded["events"], recorded["decisions"], recorded["build_seconds"], True
    for stale in (path, manifest, Path(f"{path}-wal"), Path(f"{path}-shm")):
        stale.unlink(missing_ok=True)
    started = time.perf_counter()
    events, decisions = build_log(f"sqlite:///{path}", requests)
    built = time.perf_counter() - started
    manifest.write_text(json.dumps({**wanted, "events": events, "decisions": decisions,
                                    "build_seconds": built}))
    return events, decisions, built, False


def run(path: Path, requests: int) -> dict[str, Any]:
    events, decisions, built, reused = prepared_log(path, requests)
    url = f"sqlite:///{path}"
    quarter = events // 4
    results = {"floor": in_child(url, "floor"), "rebuild_quarter": in_child(url, "rebuild", quarter),
               "rebuild": in_child(url, "rebuild"), "verify": in_child(url, "verify")}
    floor, rebuild = results["floor"], results["rebuild"]
    return {"events": events, "decisions": decisions, "requests": requests,
            "build_seconds": built, "log_reused": reused, "quarter_events": quarter,
            "results": results, "rebuild_ratio_to_floor": floor["seconds"] / rebuild["seconds"],
            "rebuild_peak_growth_mib": rebuild["peak_rss_mib"]
            - results["rebuild_quarter"]["peak_rss_mib"],
            "load_average": load_average()}


def figures(report: dict[str, Any]) -> list[Figure]:
    """Rebuild beside the scan floor, its peak memory beside a quarter of the log, and verify."""
    results, events = report["results"], report["events"]
    rebuild, floor, verify = results["rebuild"], results["floor"], results["verify"]
    quarter = results["rebuild_quarter"]
    per_100k = verify["seconds"] * 100_000 / max(verify["count"], 1)
    return [
        Figure(f"replay: rebuild every projection, events/s ({events:,} events)",
               events / rebuild["seconds"], events / floor["seconds"], "events/s",
               "scan and decode the same rows", ">= 0.5", report["rebuild_ratio_to_floor"] >= 0.5),
        Figure(f"replay: rebuild peak RSS, MiB ({events:,} events)", rebuild["peak_rss_mib"],
               quarter["peak_rss_mib"], "MiB", f"same, {report['quarter_events']:,} events",
               "< 300 MB, flat", rebuild["peak_rss_mib"] * 1.048576 < 300
               and rebuild["peak_rss_mib"] - quarter["peak_rss_mib"] < 10),
        Figure(f"replay --verify: seconds per 100,000 decisions ({verify['count']:,} verified, "
               f"{verify['drifts']} drifted)", per_100k, 60.0, "s", "the issue's limit", "< 60 s",
               per_100k < 60 and verify["drifts"] == 0),
    ]


def print_report(report: dict[str, Any]) -> None:
    results, events = report["results"], report["events"]
    reused = "reused a log " if report["log_reused"] else ""
    print(f"replay benchmark: {events:,} events, {report['decisions']:,} decisions "
          f"({reused}built in {report['build_seconds']:.1f}s; load {report['load_average']})")
    sizes = {"rebuild_quarter": report["quarter_events"]}
    rows = [[name.replace("_", " "), f"{sizes.get(name, events):,}", f"{r['seconds']:.2f}",
             f"{sizes.get(name, events) / r['seconds']:,.0f}",
             f"{r['rows_kept']:,}" if r["rows_kept"] else "", f"{r['peak_rss_mib']:.0f}"]
            for name, r in results.items()]
    print(format_table(["what", "events", "seconds", "events/s", "rows kept", "peak RSS MiB"],
                       rows))
    verify = results["verify"]
    print(f"rebuild / floor speed: {report['rebuild_ratio_to_floor']:.2f} (goal >= 0.5); "
          f"rebuild peak grew {report['rebuild_peak_growth_mib']:+.0f} MiB from a quarter of the "
          f"log to all of it (goal: flat, < 300 MB); verify re-derived {verify['count']:,} "
          f"decisions in {verify['seconds']:.1f}s "
          f"({verify['seconds'] * 100_000 / max(verify['count'], 1):.1f}s per 100,000; goal < 60) "
          f"with {verify['drifts']} drifted")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--requests", type=count(), default=50_000,
                      help="admission requests in the workload (about 6 events each)")
    size.add_argument("--events", type=count(),
                      help="about this many events in the log (1000000 for the issue's scale)")
    parser.add_argument("--log", type=Path, help="keep the built log here and reuse it next time")
    parser.add_argument("--json", action="store_true")
    add_figures_argument(parser)
    parser.add_argument("--child", nargs=3, metavar=("URL", "WHAT", "POSITION"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        url, what, position = args.child
        print(json.dumps(measure(url, what, int(position) or None)))
        return
    requests = round(args.events / EVENTS_PER_REQUEST) if args.events else args.requests
    if args.log is not None:
        report = run(args.log.resolve(), requests)
    else:
        with tempfile.TemporaryDirectory() as folder:
            report = run(Path(folder) / "replay.db", requests)
    write_figures(args.figures_out, figures(report))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)


if __name__ == "__main__":
    main()
