"""The demo: a small fleet from the catalog, a release-gated plan, a slice of a real trace,
scaling up and down, a canary that promotes and one that rolls back, then replay and verify.

Everything goes through the queue and the log, exactly as operators' commands would; what is
left behind (`fleet.db` by default) can be explored with `status`, `log` and `explain`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.catalog.registry import fixtures_dir, load_catalog
from controlplane.commands import command_adapter
from controlplane.errors import InputError
from controlplane.policies.fleet_plan import scenario_digest, scenario_from_plain
from controlplane.policies.fleet_plan_scenario import Scenario
from controlplane.policies.reasons import PolicyInputError, to_plain
from controlplane.replay import compare_with_live, state_at
from controlplane.replay.verify import verify_decisions
from controlplane.settings import Settings
from controlplane.simulation.traces import Trace, read_trace
from controlplane.workloads import at, model, observe, placement, ready, two_canaries
from events.model import RecordedEvent
from events.store import EventStore
from events.verify import verify_log
from workers.pipeline import submit, wait_for_decisions

POOL = "chat"
PREFILL_TOKENS_PER_SECOND = 8_000.0  # an H100 serving an 8B model, order of magnitude
DECODE_SECONDS_PER_TOKEN = 0.02
Progress = Callable[[str], None]


@dataclass
class DemoReport:
    """What the demo decided, counted from the log, and the proofs it ran at the end."""

    run_id: str
    phases: list[dict[str, Any]] = field(default_factory=list)
    highlights: list[dict[str, Any]] = field(default_factory=list)
    decisions_by_type: dict[str, int] = field(default_factory=dict)
    projection_differences: int = 0
    decisions_rederived: int = 0
    drifts: int = 0
    chain_ok: bool = False
    events_checked: int = 0

    @property
    def ok(self) -> bool:
        return self.projection_differences == 0 and self.drifts == 0 and self.chain_ok


@dataclass(frozen=True)
class DemoInputs:
    """What the demo reads from the fixtures directory: the plan's scenario and the trace."""

    scenario: Scenario
    trace: Trace


def demo_inputs(trace_requests: int) -> DemoInputs:
    """Read everything the demo needs from `FLEET_FIXTURES_DIR` (the catalog, the default
    scenario, the trace) before anything is written; InputError naming the variable if any of
    it cannot be read, so a bad directory leaves no half-run demo in the log."""
    directory = fixtures_dir()
    try:
        load_catalog()
        plain = json.loads((directory / "scenarios" / "default.json").read_text("utf-8"))
        return DemoInputs(scenario_from_plain(plain),
                          read_trace(default_trace_path(), limit=trace_requests))
    except (OSError, ValueError, PolicyInputError, InputError) as error:
        detail = error.message if isinstance(error, PolicyInputError) else str(error)
        raise InputError(f"FLEET_FIXTURES_DIR: the demo cannot read its fixtures in {directory}: "
                         f"{detail}") from None


class Demo:
    """Runs the demo's phases against one store, each through `workers.pipeline.submit`."""

    def __init__(self, settings: Settings, store: EventStore, run_id: str, inputs: DemoInputs,
                 progress: Progress | None = None) -> None:
        self.settings, self.store, self.run_id = settings, store, run_id
        self.inputs = inputs
        self.progress = progress or (lambda _: None)
        self.report = DemoReport(run_id)

    def name(self, base: str) -> str:
        return f"{self.run_id}-{base}"

    def _run(self, phase: str, payloads: list[dict[str, Any]]) -> list[RecordedEvent]:
        """Submit one phase, wait for every decision (follow-ups included), count outcomes."""
        self.progress(phase)
        commands = [command_adapter.validate_python(p) for p in payloads]
        events: list[RecordedEvent] = []
        for start in range(0, len(commands), 2_000):
            chunk = commands[start:start + 2_000]
            submit(self.settings, self.store, chunk)
            for outcome in wait_for_decisions(self.store, [c.command_id for c in chunk], 300):
                events.extend(outcome.events)
        # "applied" marks the secondary events of a decision (GPU and pool bookkeeping).
        outcomes = Counter(e.data["outcome"] for e in events
                           if "outcome" in e.data and e.data["outcome"] != "applied")
        self.report.phases.append({"phase": phase, "commands": len(commands),
                                   "outcomes": dict(sorted(outcomes.items()))})
        return events

    def fleet(self) -> None:
        nodes = [("h100-a", 4, "H100-SXM-80GB", 79.19), ("h100-b", 4, "H100-SXM-80GB", 79.19),
                 ("l40s-a", 2, "L40S-48GB", 44.4)]
        payloads: list[dict[str, Any]] = [
                    {"type": "RegisterNode", "command_id": self.name(f"register-{node}"),
                     "node_id": self.name(node), "rack": "rack-1" if node.startswith("h") else "rack-2",
                     "at": at(0), "gpus": [{"gpu_id": f"g{i}", "gpu_type": kind, "memory_gib": gib,
                                            "capabilities": ["bf16", "fp8"]} for i in range(count)]}
                    for node, count, kind, gib in nodes]
        payloads += [{**model(self.name("llama-8b")), "command_id": self.name("model-llama"),
                      "catalog_id": "meta-llama/Llama-3.1-8B-Instruct"},
                     {**model(self.name("qwen-7b")), "command_id": self.name("model-qwen"),
                      "catalog_id": "Qwen/Qwen2.5-7B-Instruct"},
                     {"type": "SetPolicy", "command_id": self.name("policy-autoscaling"),
                      "name": "autoscaling", "at": at(0),
                      "parameters": {"min_replicas": 1, "max_replicas": 4,
                                     "service_tokens_per_second_per_replica": 2_500.0,
                                     "scale_up_cooldown_seconds": 20.0,
                                     "scale_down_stabilization_seconds": 60.0}}]
        self._run("register the fleet", payloads)

    def plan(self) -> None:
        scenario = self.inputs.scenario
        plan_id = f"{self.run_id}-{scenario_digest(scenario)[:16]}"
        events = self._run("plan the release (spec default scenario)", [{
            "type": "PlanFleet", "command_id": self.name("plan"), "plan_id": plan_id,
            "scenario": to_plain(scenario), "at": at(1)}])
        stream = [e for e in self.store.read_stream(f"plan/{plan_id}") if "outcome" in e.data]
        self.report.phases[-1]["outcomes"] = dict(Counter(e.data["outcome"] for e in stream))
        if stream:
            self.highlight("plan verdict", stream[-1])
        del events

    def replicas(self) -> None:
        pool = self.name(POOL)
        names = [self.name(f"{POOL}-{i}") for i in (1, 2)]
        self._run("place two replicas", [
            {**placement(name, pool, self.name("llama-8b"), seconds=2),
             "command_id": self.name(f"place-{i}")} for i, name in enumerate(names)])
        self._run("replicas warm up and become ready", [
            {**ready(name, seconds=30), "command_id": self.name(f"ready-{i}")}
            for i, name in enumerate(names)])

    def trace(self) -> None:
        """A slice of the Azure 2023 conversation trace, played as admissions and releases."""
        trace = self.inputs.trace
        pool = self.name(POOL)
        timeline: list[tuple[float, int, dict[str, Any]]] = []
        for request in trace.requests:
            arrival = 60 + request.arrival_seconds
            request_id = self.name(f"req-{request.index:05d}")
            timeline.append((arrival, 0, {
                "type": "AdmitRequest", "command_id": f"admit-{request_id}", "request_id": request_id,
                "pool_id": pool, "at": at(arrival), "prompt_tokens": request.prompt_tokens,
                "max_output_tokens": request.output_tokens, "deadline_at": at(arrival + 30)}))
            done = (arrival + request.prompt_tokens / PREFILL_TOKENS_PER_SECOND
                    + request.output_tokens * DECODE_SECONDS_PER_TOKEN)
            timeline.append((done, 1, {"type": "ReleaseRequest", "command_id": f"release-{request_id}",
                                       "request_id": request_id, "at": at(done)}))
        # Three requests far past the per-request token bound: the policy must shed them.
        end = 60 + trace.span_seconds
        for index in range(3):
            request_id = self.name(f"oversize-{index}")
            timeline.append((end, 0, {
                "type": "AdmitRequest", "command_id": f"admit-{request_id}", "request_id": request_id,
                "pool_id": pool, "at": at(end), "prompt_tokens": 900_000, "max_output_tokens": 4_096,
                "deadline_at": at(end + 30)}))
        timeline.sort(key=lambda item: (item[0], item[1]))
        events = self._run(f"play {len(trace.requests)} requests of the Azure 2023 conversation "
                           "trace", [payload for _, _, payload in timeline])
        shed = next((e for e in events if e.event_type == "RequestShed"), None)
        if shed is not None:
            self.highlight("a shed request", shed)

    def scaling(self) -> float:
        pool = self.name(POOL)
        start = 60 + 200.0
        events = self._run("a load spike: the autoscaler scales up", [
            {**observe(self.name("tick-spike"), pool, start, 9_000.0, 40_000)}])
        decision = next(e for e in events if e.event_type == "ScaleDecided")
        self.highlight("scale-up", decision)
        self.store_wait_for_followups()  # the placements the scale-up issued
        warming = state_at(self.store).get("pool", pool) or {"warming": {}}
        issued = sorted(warming["warming"])
        self._run("new replicas finish warming", [
            {**ready(replica, seconds=start + 60), "command_id": self.name(f"ready-{replica}")}
            for replica in issued])
        quiet = [observe(self.name(f"tick-quiet-{i}"), pool, start + 90 + 15 * i, 500.0)
                 for i in range(7)]
        events = self._run("load falls: after the stabilization window it scales down", quiet)
        downs = [e for e in events if e.event_type == "ScaleDecided"
                 and e.data["outcome"] not in ("hold", "steady")]
        if downs:
            self.highlight("scale-down", downs[-1])
        return start + 300

    def store_wait_for_followups(self) -> None:
        from controlplane.service import pending_command_ids

        pending = pending_command_ids(self.store)
        if pending:
            wait_for_decisions(self.store, pending, 120)

    def canaries(self, seconds: float) -> None:
        pool = self.name(POOL)
        rungs = ["two canaries: start", "two canaries: warmed shadow evidence",
                 "two canaries: shadow passes into a 1% canary", "two canaries: 1% widens to 10%",
                 "two canaries at 10%: one promotes, one regresses p95 TPOT"]
        for label, rung in zip(rungs, two_canaries(pool, seconds), strict=True):
            payloads = [{**p, "command_id": self.name(p["command_id"]),
                         **({"rollout_id": self.name(p["rollout_id"])} if "rollout_id" in p else {})}
                        for p in rung]
            self._run(label, payloads)
            self.store_wait_for_followups()  # each rung's evaluation, before the next measurement
        for rollout_id in ("canary-good", "canary-bad"):
            decided = [e for e in self.store.read_stream(f"rollout/{self.name(rollout_id)}")
                       if e.event_type in ("RolloutPromoted", "RolloutRolledBack")]
            if decided:
                self.highlight(f"{rollout_id} verdict", decided[-1])

    def highlight(self, label: str, event: RecordedEvent) -> None:
        reasons = event.data.get("reasons", [])
        self.report.highlights.append({
            "what": label, "event_type": event.event_type, "outcome": event.data.get("outcome"),
            "command_id": event.command_id, "why": [f"{r['code']}: {r['message']}" for r in reasons[:2]]})

    def verify(self) -> None:
        self.progress("replay and verify the whole log")
        report = self.report
        counts = Counter(e.event_type for e in self.store.read_all()
                         if "outcome" in e.data and e.event_type != "CommandAccepted")
        report.decisions_by_type = dict(sorted(counts.items()))
        report.projection_differences = len(compare_with_live(self.store))
        verified = verify_decisions(self.store)
        report.decisions_rederived, report.drifts = verified.decisions_checked, len(verified.drifts)
        chain = verify_log(self.store)
        report.chain_ok, report.events_checked = chain.ok, chain.events_checked

    def run(self) -> DemoReport:
        self.fleet()
        self.plan()
        self.replicas()
        self.trace()
        after = self.scaling()
        self.canaries(after)
        self.verify()
        return self.report


def default_trace_path() -> Path:
    return fixtures_dir() / "traces" / "AzureLLMInferenceTrace_conv.csv"
