"""The queue path on fakeredis and on a real Redis: every command decided exactly once."""

from __future__ import annotations

import json
import zlib
from collections import Counter

import pytest
from redis import Redis

from controlplane.commands import command_adapter
from controlplane.decisions import ACCEPTED
from controlplane.errors import SubmissionRejected
from controlplane.service import accept, pending_command_ids
from controlplane.settings import Settings
from events.projections import SqlProjections
from events.store import EventStore
from tests.conftest import forget_queue
from tests.factories import assess_memory, place_replica, register_model, register_node
from tests.fleet_helpers import run
from workers.queue import command_queue, enqueue_commands
from workers.runner import work


def commands(count: int, prefix: str = "c") -> list:
    return [command_adapter.validate_python(assess_memory(f"{prefix}{i:05d}", layers=1 + i % 64))
            for i in range(count)]


def decision_counts(store: EventStore) -> Counter[str]:
    return Counter(e.command_id for e in store.read_all()
                   if e.event_type != ACCEPTED and e.command_id)


def run_workers(connection: Redis) -> None:
    # A forking worker needs a real Redis; the fake lives in this process's memory.
    forking = not connection.__class__.__module__.startswith("fakeredis")
    work(connection, [Settings.from_env().command_queue], burst=True, forking=forking)


@pytest.mark.slow
def test_a_thousand_commands_are_each_decided_exactly_once(
        store: EventStore, queue_redis: Redis) -> None:
    batch = commands(1_000)
    accepted = accept(store, batch)
    assert len(accepted) == 1_000
    job_ids = enqueue_commands(queue_redis, Settings(batch_size=100), accepted)
    assert len(job_ids) == 10
    run_workers(queue_redis)
    counts = decision_counts(store)
    assert len(counts) == 1_000 and set(counts.values()) == {1}
    assert pending_command_ids(store) == []


def test_the_same_job_delivered_twice_appends_nothing(store: EventStore, queue_redis: Redis) -> None:
    accepted = accept(store, commands(20))
    settings = Settings(batch_size=20)
    enqueue_commands(queue_redis, settings, accepted)
    run_workers(queue_redis)
    head = store.head()
    # Deliver the very same job again (same job id, same command ids).
    enqueue_commands(queue_redis, settings, accepted)
    assert command_queue(queue_redis).count == 1
    run_workers(queue_redis)
    assert store.head() == head
    assert set(decision_counts(store).values()) == {1}


def test_submitting_the_same_commands_twice_accepts_each_once(store: EventStore) -> None:
    batch = commands(5)
    assert len(accept(store, batch)) == 5
    assert accept(store, batch) == []
    assert sum(1 for e in store.read_all() if e.event_type == ACCEPTED) == 5


def test_a_used_command_id_for_a_different_command_is_refused_and_nothing_is_written(
        store: EventStore) -> None:
    """The same command again is accepted once; another under its id had been dropped without
    a word (and `--wait` showed its submitter the first command's decision)."""
    first = command_adapter.validate_python(assess_memory("same-id", gpu_memory_gib=40.0))
    other = command_adapter.validate_python(assess_memory("same-id", gpu_memory_gib=80.0))
    # Resubmitted with its time defaulted anew: still the same command.
    again = command_adapter.validate_python({**assess_memory("same-id", gpu_memory_gib=40.0)})
    assert accept(store, [first]) == ["same-id"]
    assert accept(store, [again]) == []
    head = store.head()
    with pytest.raises(SubmissionRejected) as refused:
        accept(store, [other])
    assert [(p.field, p.line) for p in refused.value.problems] == [("command_id", 1)]
    with pytest.raises(SubmissionRejected) as within:  # twice in one submission
        accept(store, commands(1, "fresh") + [command_adapter.validate_python(
            assess_memory("fresh00000", layers=7))])
    assert [(p.field, p.line) for p in within.value.problems] == [("command_id", 2)]
    assert store.head() == head


START_ROLLOUT = {"type": "StartRollout", "command_id": "start-ro1", "rollout_id": "ro1",
                 "pool_id": "chat", "baseline_revision": "stable",
                 "candidate_revision": "candidate"}


@pytest.mark.parametrize(("again", "field"), [
    (register_node("n1"), "node_id"),
    (register_model(), "model_id"),
    (place_replica("r1"), "replica_id"),
    (START_ROLLOUT, "rollout_id"),
], ids=["node", "model", "replica", "rollout"])
def test_a_second_command_creating_what_the_fleet_has_is_refused_at_submit_for_every_kind(
        store: EventStore, again: dict, field: str) -> None:
    """A node, model, replica or rollout id the fleet has, under a new command id: refused at
    submit naming the field, nothing written (a duplicate node and rollout were refused, a
    duplicate model and replica accepted and recorded as rejections)."""
    run(store, register_node("n1"), register_model(), place_replica("r1"), START_ROLLOUT)
    head = store.head()
    with pytest.raises(SubmissionRejected) as refused:
        accept(store, [command_adapter.validate_python({**again, "command_id": "again"})])
    assert [(p.field, p.line) for p in refused.value.problems] == [(field, 1)]
    assert "already" in refused.value.problems[0].message
    assert store.head() == head


@pytest.mark.parametrize(("creator", "field"), [
    (register_node("n2"), "node_id"), (register_model("m2"), "model_id"),
    (place_replica("r2"), "replica_id")], ids=["node", "model", "replica"])
def test_a_second_creator_of_one_id_is_refused_whether_in_the_submission_or_pending(
        store: EventStore, creator: dict, field: str) -> None:
    """Two commands creating one id in one submission, or one while another is undecided: the
    second had been accepted and recorded as a rejection."""
    run(store, register_node("n1"), register_model())
    first = command_adapter.validate_python(creator)
    second = command_adapter.validate_python({**creator, "command_id": "again"})
    with pytest.raises(SubmissionRejected) as refused:
        accept(store, [first, second])
    assert [(p.field, p.line) for p in refused.value.problems] == [(field, 2)]
    assert "earlier line or by a command not yet decided" in refused.value.problems[0].message
    assert accept(store, [first]) == [first.command_id]  # accepted, not decided yet
    with pytest.raises(SubmissionRejected):
        accept(store, [second])


def test_placing_a_released_replicas_id_again_is_refused_saying_it_was_released(
        store: EventStore) -> None:
    run(store, register_node("n1"), register_model(), place_replica("r1"),
        {"type": "ReleaseReplica", "command_id": "release-r1", "replica_id": "r1"})
    with pytest.raises(SubmissionRejected) as refused:
        accept(store, [command_adapter.validate_python({**place_replica("r1"),
                                                        "command_id": "again"})])
    assert "(released; an id is used once)" in refused.value.problems[0].message


def test_checking_a_submission_reads_its_rows_in_one_query_per_projection_not_per_command(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each new replica id (and each reference) had been looked up alone, under the append
    lock: a round trip per command on PostgreSQL."""
    run(store, register_node("n1"), register_model())
    loads: list[tuple[str, str]] = []
    load = SqlProjections.load_row

    def counted(self: SqlProjections, name: str, key: str) -> object:
        loads.append((name, key))
        return load(self, name, key)

    monkeypatch.setattr(SqlProjections, "load_row", counted)
    assert len(accept(store, [command_adapter.validate_python(place_replica(f"r{i}"))
                              for i in range(50)])) == 50
    assert loads == []


def test_reconcile_decides_every_command_after_the_queue_is_lost(
        store: EventStore, queue_redis: Redis) -> None:
    accepted = accept(store, commands(200))
    enqueue_commands(queue_redis, Settings(batch_size=50), accepted)
    forget_queue(queue_redis, Settings.from_env().command_queue)  # Redis lost the queue
    assert command_queue(queue_redis).count == 0
    assert len(pending_command_ids(store)) == 200
    enqueue_commands(queue_redis, Settings(batch_size=50), pending_command_ids(store))
    run_workers(queue_redis)
    counts = decision_counts(store)
    assert len(counts) == 200 and set(counts.values()) == {1}


def test_jobs_carry_ids_only_and_are_serialized_as_json(store: EventStore,
                                                        queue_redis: Redis) -> None:
    accepted = accept(store, commands(3))
    enqueue_commands(queue_redis, Settings(batch_size=10), accepted)
    job = command_queue(queue_redis).jobs[0]
    assert job.args == (accepted,) or list(job.args) == [accepted]
    raw = queue_redis.hget(f"rq:job:{job.id}", "data")
    assert raw is not None
    func_name, _instance, args, _kwargs = json.loads(zlib.decompress(raw))  # JSON, not a pickle
    assert func_name == "workers.jobs.decide_commands" and args == [accepted]
    assert job.timeout and job.result_ttl and job.failure_ttl and job.retries_left == 3
