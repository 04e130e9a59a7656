"""Replay benchmark: rebuild every projection from the log beside the floor of scanning it.

Run `python bench/replay_bench.py [--requests N] [--json]`. It decides a seeded mixed fleet
workload (`controlplane.workloads.mixed_fleet`: inventory, placements, admissions and releases,
autoscaler ticks, canaries) into a fresh SQLite log, then measures in one run, each in its own
child process so peak resident memory is its own:
  - rebuild: fold every event into fresh projections (what `fleetctl replay` does);
  - floor:   scan the same rows and decode their JSON, doing nothing else;
  - verify:  re-derive every decision (`fleetctl replay --verify`).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import format_table, load_average  # noqa: E402


def build_log(url: str, requests: int) -> tuple[int, int]:
    from controlplane.commands import command_adapter
    from controlplane.logging import configure_logging
    from controlplane.runtime import open_store
    from controlplane.service import accept, decide, pending_command_ids
    from controlplane.workloads import mixed_fleet

    configure_logging("WARNING")
    store = open_store(url)
    decided = 0
    for phase in mixed_fleet(20261130, requests=requests):
        for start in range(0, len(phase), 2_000):
            accept(store, [command_adapter.validate_python(p) for p in phase[start:start + 2_000]])
            while pending := pending_command_ids(store):
                for offset in range(0, len(pending), 500):
                    decided += len(decide(store, pending[offset:offset + 500]))
    return store.head()[0], decided


def measure(url: str, what: str) -> dict[str, float | int]:
    """Runs in a child process: one measurement and its peak resident memory."""
    from controlplane.logging import configure_logging
    from controlplane.replay import fold, verify_decisions
    from controlplane.runtime import open_store

    configure_logging("WARNING")
    store = open_store(url)
    started = time.perf_counter()
    count = 0
    if what == "rebuild":
        state = fold(store.read_all())
        count = sum(len(rows) for rows in state.tables.values())
    elif what == "floor":
        for row in store.read_all(raw=True):
            json.loads(row["data"])
            count += 1
    else:
        count = verify_decisions(store).decisions_checked
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "count": count, "peak_rss_mib": peak_mib}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000,
                        help="admission requests in the workload (about 3 events each)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("URL", "WHAT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child)))
        return
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/replay.db"
        started = time.perf_counter()
        events, decisions = build_log(url, args.requests)
        built = time.perf_counter() - started
        results = {}
        for what in ("floor", "rebuild", "verify"):
            out = subprocess.run([sys.executable, __file__, "--child", url, what],
                                 capture_output=True, text=True, check=True).stdout
            results[what] = json.loads(out.strip().splitlines()[-1])
    floor, rebuild, verify = results["floor"], results["rebuild"], results["verify"]
    report = {"events": events, "decisions": decisions, "build_seconds": built,
              "results": results, "rebuild_ratio_to_floor": floor["seconds"] / rebuild["seconds"],
              "load_average": load_average()}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"replay benchmark: {events:,} events, {decisions:,} decisions "
          f"(built in {built:.1f}s; load {report['load_average']})")
    rows = [[name, f"{r['seconds']:.2f}", f"{events / r['seconds']:,.0f}", f"{r['peak_rss_mib']:.0f}"]
            for name, r in (("scan floor", floor), ("rebuild", rebuild), ("verify", verify))]
    print(format_table(["what", "seconds", "events/s", "peak RSS MiB"], rows))
    print(f"rebuild / floor speed: {report['rebuild_ratio_to_floor']:.2f} (goal >= 0.5); "
          f"verify re-derived {verify['count']:,} decisions in {verify['seconds']:.1f}s")


if __name__ == "__main__":
    main()
