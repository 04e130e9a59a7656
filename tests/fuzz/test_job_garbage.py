"""Garbage handed to the decide job never writes, and (once fixed) is refused with a typed error.

The right behaviour: `workers.jobs.decide_commands` takes what RQ's JSON serializer can carry, so
anything may arrive. It must accept only a list of command ids (strings matching `CommandId`, at
most a bounded number) and refuse anything else with `InputError` before it reads the store;
well-formed ids that name no accepted command are skipped. A refused job writes nothing.
"""

from __future__ import annotations

import contextlib
from typing import Any

from redis import Redis
from rq.job import JobStatus

from controlplane.commands import command_adapter
from controlplane.decisions import ACCEPTED
from controlplane.errors import InputError
from controlplane.service import accept
from controlplane.settings import Settings
from events.store import EventStore
from tests.factories import assess_memory
from workers.jobs import decide_commands
from workers.queue import DECIDE_JOB, command_queue
from workers.runner import work

NOT_A_LIST: dict[str, Any] = {"null": None, "integer": 7, "float": 3.5, "bool": True,
                              "string": "cmd-1", "object": {"cmd-1": 1}}
NOT_COMMAND_IDS: dict[str, Any] = {
    "integers": [1, 2], "nulls": [None], "lists": [["x"]], "objects": [{"a": 1}], "empty": [""],
    "sql": ["x'); DROP TABLE events;--", "' OR '1'='1"], "nul": ["a\x00b"], "surrogate": ["\udcff"],
    "too_long": ["x" * 10_000],
}
GARBAGE = {**NOT_A_LIST, **NOT_COMMAND_IDS}


def _log_intact(store: EventStore) -> int:
    return sum(1 for _ in store.read_all())  # raises if a table was dropped or corrupted


def test_a_garbage_decide_job_never_writes(store: EventStore) -> None:
    head, events = store.head(), _log_intact(store)
    for garbage in GARBAGE.values():
        with contextlib.suppress(Exception):  # whether it raises is the next test's business
            decide_commands(garbage)
    assert store.head() == head
    assert _log_intact(store) == events


def test_a_decide_job_that_is_not_a_list_of_command_ids_is_refused_with_a_typed_error(
        store: EventStore) -> None:
    head = store.head()
    not_refused = {}
    for name, garbage in GARBAGE.items():
        try:
            not_refused[name] = repr(decide_commands(garbage))
        except InputError:
            continue
        except Exception as error:
            not_refused[name] = f"{type(error).__name__}: {error}"
    assert store.head() == head
    assert not_refused == {}


def test_well_formed_unknown_ids_are_skipped_and_write_nothing(store: EventStore) -> None:
    accepted = accept(store, [command_adapter.validate_python(assess_memory("known"))])
    head = store.head()
    unknown = [f"unknown-{i}" for i in range(2_000)] + ["events", "drop.table:events", "x--1"]
    assert decide_commands(unknown) == {"decided_now": 0, "already_decided": 0,
                                        "waiting_for_creators": 0}
    assert store.head() == head
    assert decide_commands(accepted + unknown)["decided_now"] == 1  # known ids still decided


def test_garbage_jobs_on_the_queue_fail_alone_and_the_worker_decides_the_next_job(
        store: EventStore, queue_redis: Redis) -> None:
    queue = command_queue(queue_redis)
    garbage_jobs = {name: queue.enqueue(DECIDE_JOB, GARBAGE[name], retry=None)
                    for name in ("null", "string", "lists", "sql", "nul")}
    accepted = accept(store, [command_adapter.validate_python(assess_memory("after-garbage"))])
    good_job = queue.enqueue(DECIDE_JOB, accepted)
    head = store.head()
    forking = not queue_redis.__class__.__module__.startswith("fakeredis")
    work(queue_redis, [Settings.from_env().command_queue], burst=True, forking=forking)
    assert good_job.get_status(refresh=True) == JobStatus.FINISHED
    written = list(store.read_all(from_position=head[0]))
    assert [(e.command_id, e.event_type != ACCEPTED) for e in written] == [(accepted[0], True)]
    for job in garbage_jobs.values():
        assert job.get_status(refresh=True) in (JobStatus.FAILED, JobStatus.FINISHED)
