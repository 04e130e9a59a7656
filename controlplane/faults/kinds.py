"""The faults, and one seeded run of the mixed scenario with a fault injected at random points.

The seed fixes the scenario (its commands) and the fault plan (when each fault strikes, how
long a lock is held, which jobs are delivered again); process timing does the rest.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace

from rq.exceptions import InvalidJobOperation
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from sqlalchemy import text
from sqlalchemy.engine import make_url

from controlplane.decisions import ACCEPTED
from controlplane.faults.harness import FaultTarget, Fleet, RedisServer
from controlplane.faults.invariants import check_fleet_invariants
from controlplane.service import decide
from controlplane.workloads import mixed_fleet
from workers.queue import command_queue

Inject = Callable[[Fleet, random.Random], bool]
CHUNK = 50
FAULT_SPACING = 15  # decisions between two faults of a run, so each is recovered from apart
DEFAULT_BASE_SEED = 20261130
DATABASES = ("sqlite", "postgresql")


def kill_worker_mid_job(fleet: Fleet, rng: random.Random) -> bool:
    """SIGKILL a worker (and its work horse) while it runs a batch; start a replacement."""
    busy = fleet.busy_worker(2.0)
    if busy is None:
        return False
    fleet.kill_worker(busy[0])
    fleet.start_worker()
    return True


def restart_redis_losing_queue(fleet: Fleet, rng: random.Random) -> bool:
    """SIGKILL the private Redis (queue, registries and jobs lost) and start it again empty."""
    assert fleet.redis_server is not None
    fleet.redis_server.kill()
    time.sleep(rng.uniform(0.1, 0.8))
    fleet.redis_server.start()
    return True


def drop_postgres_mid_transaction(fleet: Fleet, rng: random.Random) -> bool:
    """`pg_terminate_backend` on a worker connection that is inside a transaction."""
    query = text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE application_name = :name AND xact_start IS NOT NULL AND state <> 'idle'")
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        with fleet.store.engine.connect() as conn:
            terminated = [row[0] for row in conn.execute(query, {"name": fleet.application_name})]
            conn.commit()
        if any(terminated):
            return True
        time.sleep(0.002)
    return False


def hold_sqlite_write_lock(fleet: Fleet, rng: random.Random) -> bool:
    """Another writer holds the database with `BEGIN IMMEDIATE` while workers try to decide."""
    with _append_lock_held(fleet):
        time.sleep(rng.uniform(0.3, 1.2))
    return True


def deliver_twice(fleet: Fleet, rng: random.Random) -> bool:
    """The same job again, the same ids in other batches, and the same ids decided in-process."""
    if not fleet.batches:
        return False
    batch = rng.choice(fleet.batches)
    fleet.enqueue(batch)  # the same job id: RQ runs the job a second time
    start = rng.randrange(len(fleet.accepted))
    window = fleet.accepted[start:start + 40]
    fleet.enqueue(window, replace(fleet.settings, batch_size=7))
    decide(fleet.store, rng.sample(window, min(10, len(window))))
    fleet.tally.duplicates_delivered += len(batch) + len(window) + min(10, len(window))
    return True


def abandon_job_to_registry_cleanup(fleet: Fleet, rng: random.Random) -> bool:
    """Kill a worker mid-job, let its execution expire, and run RQ's started-job registry cleanup.

    The cleanup retries the job (or fails it once retries are spent); the retried job is
    delivered again, and a replacement worker reconciles whatever is still undecided.
    """
    # The log's write lock is held while the victim is chosen and killed, so its job, blocked
    # appending, cannot end just before the kill (decisions got fast enough for that to be likely).
    with _append_lock_held(fleet):
        busy = fleet.busy_worker(2.0)
        if busy is None:
            return False
        victim, job_id = busy
        fleet.kill_worker(victim)
    fleet.start_worker()
    queue = command_queue(fleet.redis, fleet.target.queue)
    if _status(fleet, job_id) != JobStatus.STARTED:
        fleet.tally.notes.append(f"killed just after job {job_id[-8:]} ended: not abandoned")
        return False
    started = StartedJobRegistry(queue=queue)
    # The dead horse stops heartbeating: its execution expires. Only this one is made old, so
    # the other worker's live job is left alone, as RQ's maintenance would leave it.
    entries: list[bytes] = list(fleet.redis.zrange(started.key, 0, -1))  # type: ignore[arg-type]
    expired = {entry: 1.0 for entry in entries if entry.decode().startswith(f"{job_id}:")}
    if expired:
        fleet.redis.zadd(started.key, expired)
    started.cleanup()
    status = _status(fleet, job_id)
    fleet.tally.notes.append(f"abandoned job {job_id[-8:]}: {getattr(status, 'value', status)}")
    if status == JobStatus.STARTED:
        fleet.tally.notes.append(f"violation: registry cleanup left job {job_id} started")
    scheduled = ScheduledJobRegistry(queue=queue)  # type: ignore[no-untyped-call]
    if job_id in scheduled.get_job_ids():
        # The retry, delivered now rather than after its back-off (unless a worker's
        # retry delivery got there first: delivered again all the same).
        with suppress(InvalidJobOperation):
            scheduled.requeue(job_id)
        fleet.tally.duplicates_delivered += 1
    return True


@contextmanager
def _append_lock_held(fleet: Fleet) -> Iterator[None]:
    """Hold the log's append lock (SQLite: BEGIN IMMEDIATE; PostgreSQL: the head row), appending
    nothing: a write transaction of the store, as any other writer would take it."""
    with fleet.store.transaction():
        yield


def _status(fleet: Fleet, job_id: str) -> JobStatus | None:
    return Job.fetch(job_id, connection=fleet.redis, serializer=JSONSerializer).get_status()


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault: how to inject it, how many workers race, which database it needs."""

    name: str
    inject: Inject
    workers: int = 2
    faults_per_run: int = 2
    database: str | None = None  # "sqlite" or "postgresql" when the fault needs that backend
    own_redis: bool = False


FAULT_KINDS: dict[str, FaultKind] = {kind.name: kind for kind in (
    FaultKind("worker_sigkill", kill_worker_mid_job),
    FaultKind("redis_restart", restart_redis_losing_queue, faults_per_run=1, own_redis=True),
    FaultKind("postgres_dropped", drop_postgres_mid_transaction, database="postgresql"),
    FaultKind("sqlite_locked", hold_sqlite_write_lock, faults_per_run=3, database="sqlite"),
    FaultKind("duplicate_delivery", deliver_twice, faults_per_run=3),
    FaultKind("abandoned_job", abandon_job_to_registry_cleanup),
)}


def base_seed() -> int:
    """`FLEET_FAULT_SEED` moves every run's seed at once; the default keeps CI reproducible."""
    return int(os.environ.get("FLEET_FAULT_SEED") or DEFAULT_BASE_SEED)


def seed_for(kind: str, index: int, database: str) -> int:
    """The seed of run `index` of `kind` on `database`: the tests and the report share it."""
    return (base_seed() + 1_000 * list(FAULT_KINDS).index(kind) + 10 * index
            + DATABASES.index(database))


def planned_runs(runs: int, databases: tuple[str, ...] = DATABASES) -> list[tuple[str, str, int]]:
    """(kind, database, index) for `runs` runs of each kind on each database it can use; a kind
    bound to one database gets `runs` per database offered, so every kind runs alike often."""
    plan = []
    for kind in FAULT_KINDS.values():
        usable = [kind.database] if kind.database else list(databases)
        count = runs * len(databases) if kind.database else runs
        plan += [(kind.name, database, index) for database in usable if database in databases
                 for index in range(count)]
    return plan


@dataclass
class FaultRun:
    """The result of one seeded run: what was done, what was checked, and every violation."""

    kind: str
    seed: int
    database: str
    requests: int
    commands_accepted: int = 0
    commands_decided: int = 0
    faults_planned: int = 0
    faults_injected: int = 0
    duplicates_delivered: int = 0
    reconciles: int = 0
    workers_killed: int = 0
    records_lost: int = 0
    decisions_rederived: int = 0
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def reproduce(self) -> str:
        return (f"python bench/reliability_report.py --kind {self.kind} --seed {self.seed} "
                f"--only {self.database} --requests {self.requests}")


def run_fault(kind_name: str, seed: int, target: FaultTarget, requests: int = 120) -> FaultRun:
    """Drive the seeded mixed scenario through real workers, inject the fault, check invariants."""
    kind = FAULT_KINDS[kind_name]
    database = make_url(target.database_url).get_backend_name()
    run = FaultRun(kind_name, seed, database, requests, faults_planned=kind.faults_per_run)
    began = time.monotonic()
    rng = random.Random(seed)
    phases = mixed_fleet(seed, requests, nodes=4, gpus_per_node=4, replicas=4)
    total = sum(len(phase) for phase in phases)
    triggers = sorted(rng.randint(total // 5, total * 7 // 10) for _ in range(kind.faults_per_run))
    server = RedisServer(target.scratch) if kind.own_redis else None
    if server is not None:
        server.start()
        target = replace(target, redis_url=server.url)
    fleet = Fleet(target, kind.workers)
    fleet.redis_server = server

    def due(decided: int) -> None:
        while triggers and decided >= triggers[0]:
            if not kind.inject(fleet, rng):
                return  # nothing to strike yet (no job running): try again on the next poll
            triggers.pop(0)
            triggers[:] = [max(t, decided + FAULT_SPACING) for t in triggers]
            fleet.tally.faults_injected += 1

    try:
        fleet.replace_dead_workers()
        for phase in phases:
            for start in range(0, len(phase), CHUNK):
                fleet.submit(phase[start:start + CHUNK])
                due(fleet.decided_count())
            if not fleet.settle(due):
                run.violations.append("settle_timeout: commands still undecided")
                break
        fleet.drain()
    finally:
        fleet.stop()
        if server is not None:
            server.kill()
    report = check_fleet_invariants(fleet.store)
    in_log = {e.command_id for e in fleet.store.read_all() if e.event_type == ACCEPTED}
    scenario_ids = {payload["command_id"] for phase in phases for payload in phase}
    undecided = sum(1 for v in report.violations if v.startswith("undecided:"))
    fleet.store.engine.dispose()
    run.records_lost = len(scenario_ids - in_log) + undecided
    run.violations += report.violations + [n for n in fleet.tally.notes if n.startswith("violation")]
    run.notes = [n for n in fleet.tally.notes if not n.startswith("violation")]
    run.commands_accepted, run.commands_decided = report.commands_accepted, report.commands_decided
    run.decisions_rederived = report.decisions_rederived
    run.faults_injected, run.reconciles = fleet.tally.faults_injected, fleet.tally.reconciles
    run.duplicates_delivered, run.workers_killed = (fleet.tally.duplicates_delivered,
                                                    fleet.tally.workers_killed)
    run.seconds = time.monotonic() - began
    return run
