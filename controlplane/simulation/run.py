"""The simulation loop: a trace drives admission, routing, autoscaling and a rollout on a virtual clock.

Time advances in control ticks of `control_interval_seconds`. At each tick T the gateway
reports the completions of the last tick (`ReleaseRequest`, at T), warmed replicas become
ready, the autoscaler and the rollout get their evidence when due; then every request that
arrives before the next tick asks for admission (`AdmitRequest`, at its arrival time). All of
it is decided through the log in one batch, and the decisions are acted on: admitted requests
are routed to a ready replica at their arrival, placed replicas start warming, released ones
drain. So is every request a walk of the queue decided (an admission, release, readiness or
policy sheds late heads and admits heads that fit); those admitted are routed at that command's
time. Between ticks the replicas' engines run (see `dataplane`).
A request's `max_output_tokens` is its trace's output length: the simulation knows each answer's
length, where a gateway would pass the client's `max_tokens`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from controlplane.commands.base import CommandBase
from controlplane.commands.fleet import MarkReplicaReady
from controlplane.commands.traffic import AdmitRequest, ReleaseRequest
from controlplane.decisions import REJECTED
from controlplane.policies.prefix_cache import CacheScope
from controlplane.simulation.autoscaler import AutoscalerFeed
from controlplane.simulation.canary import RolloutDriver
from controlplane.simulation.config import SimulationConfig
from controlplane.simulation.control import ControlPlane, Decided
from controlplane.simulation.dataplane import Job
from controlplane.simulation.fleet import Fleet, build_fleet, replica_from
from controlplane.simulation.report import SimulationRun
from controlplane.simulation.routing import Router, block_prompt
from controlplane.simulation.sampling import Samples
from controlplane.simulation.traces import Trace
from controlplane.simulation.world import Fate, ReplicaState, RequestState, SimReplica
from controlplane.state.admission import REQUEST_ADMITTED, REQUEST_QUEUED, REQUEST_SHED
from controlplane.state.fleet import REPLICA_READY, REPLICA_RELEASED
from events.model import RecordedEvent
from events.store import EventStore

Progress = Callable[[int, int], None]


class Simulation:
    """One run over one trace, against one log this run owns."""

    def __init__(self, trace: Trace, config: SimulationConfig, store: EventStore,
                 progress: Progress | None = None) -> None:
        self.trace, self.config = trace, config.validate().validate_for(trace)
        self.control = ControlPlane(store)
        self.progress = progress
        self.router = Router(config.routing)
        self.requests = [RequestState(r, r.arrival_seconds / config.speedup) for r in trace.requests]
        self.heap: list[tuple[float, int, str, Any]] = []
        self.sequence = itertools.count()
        self.next_arrival = 0
        self.queue: dict[str, RequestState] = {}  # the control plane's admission queue
        self.unrouted: list[RequestState] = []  # admitted while no replica was ready
        self.reported: list[RequestState] = []  # completed, to be released at the next tick
        self.placements_refused = 0
        self.samples = Samples()
        span = self.requests[-1].arrival_seconds
        self.rollout = RolloutDriver(config, config.model_id, config.rollout_start_fraction * span) \
            if config.rollout else None
        self.autoscaler = AutoscalerFeed(config.pool_id, config.autoscale_interval_seconds,
                                         [(r.arrival_seconds, r.tokens) for r in self.requests],
                                         self.at)
        self.fleet: Fleet

    def at(self, seconds: float) -> datetime:
        return datetime.fromtimestamp(self.trace.start_epoch_seconds + seconds, UTC)

    def run(self) -> SimulationRun:
        """Simulate until every request is served, shed or (stuck in the queue) unfinished."""
        self.fleet = build_fleet(self.control, self.config, self.trace, self.at)
        interval = self.config.control_interval_seconds
        now = 0.0
        while True:
            self._tick(now, now + interval)
            self.samples.take(now + interval, self.fleet, len(self.queue))
            if self.progress is not None:
                self.progress(self.next_arrival, len(self.requests))
            if self._finished():
                break
            now = self._next_tick(now + interval)
        end = max([now + interval] + [r.job.completed_seconds for r in self.requests
                                      if r.job is not None and r.job.completed_seconds is not None])
        for request in self.queue.values():
            request.fate = Fate.UNFINISHED
        notes = [f"{len(self.queue)} requests stayed queued with nothing running to release them"] \
            if self.queue else []
        return SimulationRun(self.config, self.trace, self.fleet, self.requests, self.samples,
                             dict(self.control.decisions), end,
                             self.rollout.summary() if self.rollout else None,
                             self.placements_refused, notes)

    def _tick(self, now: float, until: float) -> None:
        at_now: list[CommandBase] = [ReleaseRequest(command_id=f"release-{r.trace.index}",
                                                    at=self.at(now), actor="gateway",
                                                    request_id=r.request_id)
                                     for r in self.reported]
        self.reported = []
        for replica in self.fleet.replicas.values():
            due = replica.ready_due_seconds
            if replica.state is ReplicaState.WARMING and due is not None and due <= now:
                replica.ready_due_seconds = None  # asked once; the decision says what happened
                at_now.append(MarkReplicaReady(command_id=f"ready-{replica.replica_id}",
                                               at=self.at(now), actor="simulation",
                                               replica_id=replica.replica_id))
        separate = False
        if self.config.autoscale and self.autoscaler.due(now):
            at_now.append(self.autoscaler.observe(now, self._queued_tokens(), self.next_arrival))
            separate = True
        if self.rollout is not None and self.rollout.due(now):
            at_now += self.rollout.commands(now, self.at(now))
            separate = True
        if separate:  # follow-ups (placements, evaluations) are decided before later arrivals
            self._act(self.control.run(at_now), now)
            at_now = []
        self._act(self.control.run(at_now + self._admissions(now, until)), now)
        self._run_data_plane(until)

    def _queued_tokens(self) -> int:
        """Tokens waiting: in the admission queue and on the replicas, not yet running."""
        return sum(r.tokens for r in self.queue.values()) + sum(
            r.engine.waiting_tokens for r in self.fleet.replicas.values())

    def _admissions(self, now: float, until: float) -> list[CommandBase]:
        ready = len(self.fleet.ready())
        backlog = sum(r.tokens for r in self.queue.values())
        rate = ready * self.fleet.service_tokens_per_second
        estimate = round(backlog / rate, 3) if rate > 0 else 0.0
        commands: list[CommandBase] = []
        while self.next_arrival < len(self.requests) \
                and self.requests[self.next_arrival].arrival_seconds < until:
            request = self.requests[self.next_arrival]
            self.next_arrival += 1
            if self.rollout is not None:
                request.arm = self.rollout.arm_for(request.trace.index)
            arrival = self.at(request.arrival_seconds)
            commands.append(AdmitRequest(
                command_id=f"admit-{request.trace.index}", at=arrival, actor="gateway",
                request_id=request.request_id, pool_id=self.config.pool_id,
                prompt_tokens=request.trace.prompt_tokens,
                max_output_tokens=request.trace.output_tokens,
                deadline_at=self.at(request.arrival_seconds + self.config.deadline_seconds),
                estimated_queue_seconds=min(estimate, self.config.deadline_seconds * 10)))
        return commands

    def _act(self, decided: list[Decided], now: float) -> None:
        """Carry out what each decision said, in decision order."""
        for item in decided:
            kind = item.command_type
            if kind == "PlaceReplica":
                self._placed(item, now)
            elif kind == "ObserveLoad":
                self.autoscaler.decided(item)
            elif kind == "MarkReplicaReady" and item.first(REPLICA_READY) is not None:
                replica = self.fleet.replicas[item.result["replica_id"]]
                replica.state, replica.ready_seconds = ReplicaState.READY, now
                pending, self.unrouted = self.unrouted, []
                for request in pending:
                    self._push(now, "route", request)
            self._requests_decided(item, now)
            for event in item.of_type(REPLICA_RELEASED):
                released = self.fleet.replicas.get(event.data["result"]["replica_id"])
                if released is not None:
                    released.state, released.released_seconds = ReplicaState.RELEASED, now
        if self.rollout is not None:
            self.rollout.observe(decided, now)

    def _requests_decided(self, item: Decided, now: float) -> None:
        """Settle every request a decision decided, whatever its command: an arrival's own
        admission, and each queued request a walk of the queue admitted or shed (at an
        arrival's door, after a release, on new ready capacity or a new policy)."""
        arrival: RequestState | None = None
        if item.command_type == "AdmitRequest":
            arrival = self.requests[int(item.command_id.rsplit("-", 1)[1])]
            now = arrival.arrival_seconds  # the walk at its door happened at its arrival
        own: RecordedEvent | None = None
        for event in item.of_type(REQUEST_ADMITTED, REQUEST_QUEUED, REQUEST_SHED, REJECTED):
            if arrival is not None and event.stream_id == f"request/{arrival.request_id}":
                own = event
            elif event.event_type in (REQUEST_ADMITTED, REQUEST_SHED):
                # A walk decides queued requests before the arrival is judged: FIFO, first.
                self._settle(event.data["result"]["request_id"], event.event_type, event.data, now)
        if arrival is not None:
            assert own is not None, f"no admission decision for {item.command_id}"
            self._settle(arrival.request_id, own.event_type, own.data, now)

    def _settle(self, request_id: str, event_type: str, data: dict[str, Any], now: float) -> None:
        """One request's decision, taken at `now`: admitted (routed now), queued or shed."""
        request = self.requests[int(request_id.rsplit("-", 1)[1])]
        self.queue.pop(request_id, None)
        if event_type == REQUEST_ADMITTED:
            request.fate = Fate.ADMITTED
            request.admitted_seconds = now
            self._push(request.admitted_seconds, "route", request)
        elif event_type == REQUEST_QUEUED:
            request.fate = Fate.QUEUED
            self.queue[request_id] = request
        else:
            request.fate = Fate.SHED
            request.shed_code = data["reasons"][0]["code"] if data.get("reasons") else "rejected"
            if self.rollout is not None:
                self.rollout.shed(request)

    def _placed(self, item: Decided, now: float) -> None:
        replica = replica_from(item, self.fleet, now)
        if replica is None:
            self.placements_refused += 1
            return
        replica.ready_due_seconds = now + self.config.warmup_seconds
        self.fleet.replicas[replica.replica_id] = replica

    def _push(self, when: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.heap, (when, next(self.sequence), kind, payload))

    def _run_data_plane(self, until: float) -> None:
        while self.heap and self.heap[0][0] < until:
            when, _, kind, payload = heapq.heappop(self.heap)
            if kind == "route":
                self._route(payload, when)
                continue
            replica, version = payload
            if version != replica.engine.version:
                continue  # replanned since this wake-up was scheduled
            result = replica.engine.advance()
            for job in result.prefilled:
                request = replica.jobs[job.request_index]
                if request.prompt is not None:
                    replica.prefix_cache.store(request.prompt)
            for job in result.completed:
                request = replica.jobs.pop(job.request_index)
                request.fate = Fate.COMPLETED
                replica.busy_until_seconds = max(replica.busy_until_seconds, when)
                self.reported.append(request)
                if self.rollout is not None:
                    self.rollout.completed(request)
            self._wake(replica)

    def _route(self, request: RequestState, now: float) -> None:
        ready = self.fleet.ready()
        if not ready:
            self.unrouted.append(request)
            return
        trace = request.trace
        if trace.block_hash_ids is not None and request.prompt is None:
            scope = CacheScope(self.rollout.revision(request.arm) if self.rollout
                               else self.config.model_id, "tokenizer", "none", "default")
            request.prompt = block_prompt(scope, trace.block_hash_ids, trace.prompt_tokens,
                                          self.fleet.block_size_tokens)
        replica = self.router.choose(ready, request.prompt)
        saved = replica.prefix_cache.lookup(request.prompt).saved_prefill_tokens \
            if request.prompt is not None else 0
        request.job = Job(trace.index, trace.prompt_tokens, trace.output_tokens,
                          trace.prompt_tokens - saved, now)
        request.saved_prefill_tokens, request.replica_id = saved, replica.replica_id
        replica.jobs[trace.index] = request
        replica.engine.submit(request.job, now)
        self._wake(replica)

    def _wake(self, replica: SimReplica) -> None:
        end = replica.engine.next_event_seconds()
        if end is not None:
            self._push(end, "stride", (replica, replica.engine.version))

    def _finished(self) -> bool:
        if self.next_arrival < len(self.requests) or self.reported or self.unrouted or self.heap:
            return False
        # Queued requests wait for a release; with nothing running none will come.
        return all(r.engine.idle for r in self.fleet.replicas.values())

    def _next_tick(self, after: float) -> float:
        """The next tick with work to do: skip idle stretches of the trace on the tick grid.

        The autoscaler forces a tick every interval, through idle stretches too, until it rests
        (see `autoscaler`); then its next observation comes at the next tick that has work.
        """
        interval = self.config.control_interval_seconds
        candidates = [self.heap[0][0]] if self.heap else []
        if self.next_arrival < len(self.requests):
            candidates.append(self.requests[self.next_arrival].arrival_seconds)
        if self.reported or self.unrouted:
            candidates.append(after)
        candidates += [r.ready_due_seconds for r in self.fleet.replicas.values()
                       if r.state is ReplicaState.WARMING and r.ready_due_seconds is not None]
        if not candidates:
            return after
        soonest = max(after, min(candidates))
        if self.config.autoscale and not self.autoscaler.at_rest(self._queued_tokens,
                                                                 self.next_arrival):
            soonest = min(soonest, max(after, self.autoscaler.next_seconds))
        return after + math.floor((soonest - after) / interval) * interval

