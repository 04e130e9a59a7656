"""`fleetctl demo`: the whole product on the embedded default, in about a minute."""

from __future__ import annotations

import sys
import uuid
from dataclasses import asdict
from typing import Any

import click

from controlplane.cli.context import settings_and_store
from controlplane.cli.output import emit, table
from controlplane.demo import Demo, demo_inputs
from controlplane.errors import OperationalError
from controlplane.settings import Settings, redacted_url
from workers.connections import connect, redis_url_in_use
from workers.queue import workers_serving


def _render(report: dict[str, Any]) -> str:
    lines = ["what the control plane decided, phase by phase:", ""]
    lines.append(table(["phase", "commands", "outcomes"], [
        [p["phase"], p["commands"], ", ".join(f"{k} {v}" for k, v in p["outcomes"].items())]
        for p in report["phases"]]))
    lines += ["", "why, for a few of them:"]
    for item in report["highlights"]:
        lines.append(f"  {item['what']}: {item['outcome']} ({item['event_type']}, "
                     f"command {item['command_id']})")
        lines += [f"      {why}" for why in item["why"]]
    total = sum(report["decisions_by_type"].values())
    lines += ["", f"{total} decision events in the log; then, from the log alone:",
              "  replay: rebuilt projections "
              f"{'equal' if not report['projection_differences'] else 'DIFFER FROM'} the live ones",
              f"  verify: {report['decisions_rederived']} decisions re-derived, "
              f"{'no drift' if not report['drifts'] else str(report['drifts']) + ' drifted'}",
              f"  chain:  {'intact' if report['chain_ok'] else 'BROKEN'} over "
              f"{report['events_checked']} events",
              "", "explore: fleetctl status | fleetctl log --limit 20 | "
              "fleetctl explain <command id from above>"]
    return "\n".join(lines)


def _workers_listening(settings: Settings) -> None:
    """OperationalError unless the demo's commands will be decided: on the embedded queue they
    are, in-process; on a Redis (FLEET_REDIS_URL) a worker must listen on the command queue,
    or the demo would wait five minutes per phase and fail."""
    url = redis_url_in_use(settings)
    if url is not None and not workers_serving(connect(settings), settings.command_queue):
        raise OperationalError(
            f"no worker listens on queue {settings.command_queue!r} at {redacted_url(url)}: "
            "start `fleetctl worker`, or unset FLEET_REDIS_URL to run the demo in-process")


@click.command()
@click.option("--trace-requests", default=2_000, show_default=True,
              help="How many requests of the Azure conversation trace to play.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def demo(trace_requests: int, as_json: bool) -> int:
    """Build a fleet, plan a release, play a real trace, scale, run canaries, verify the log."""
    if trace_requests <= 0:
        raise click.BadParameter("must be positive", param_hint="--trace-requests")
    inputs = demo_inputs(trace_requests)  # before the log is opened: a bad fixture writes nothing
    _workers_listening(Settings.from_env())  # before the log is opened too
    settings, store = settings_and_store()
    progress = None
    if not as_json and sys.stderr.isatty():
        def progress(phase: str) -> None:
            click.echo(f"… {phase}", err=True)
    report = Demo(settings, store, f"demo{uuid.uuid4().hex[:6]}", inputs, progress).run()
    emit(asdict(report), as_json, _render)
    return 0 if report.ok else 3
