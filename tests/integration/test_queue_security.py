"""Only RQ's JSON serializer is accepted: a pickled job is refused, never executed."""

from __future__ import annotations

import json
import zlib

import pytest
from redis import Redis
from rq import Queue
from rq.registry import FailedJobRegistry

from controlplane.settings import Settings
from events.store import EventStore
from workers.queue import command_queue
from workers.runner import work

MARKER = "/tmp/fleet-pickle-was-executed"


class _Exploit:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (open, (MARKER, "w"))


def test_a_pickled_payload_on_the_queue_is_refused_not_executed(
        store: EventStore, queue_redis: Redis) -> None:
    import os

    if os.path.exists(MARKER):
        os.remove(MARKER)
    pickled = Queue(Settings.from_env().command_queue, connection=queue_redis)  # RQ's default: pickle
    job = pickled.enqueue("workers.jobs.decide_commands", [_Exploit()])
    raw = queue_redis.hget(f"rq:job:{job.id}", "data")
    assert raw is not None
    with pytest.raises(ValueError):  # it really is a pickle, not JSON
        json.loads(zlib.decompress(raw))
    head = store.head()
    work(queue_redis, [Settings.from_env().command_queue], burst=True, forking=False)
    assert not os.path.exists(MARKER), "a pickled payload was executed"
    assert store.head() == head, "a refused job wrote to the log"
    assert job.id in FailedJobRegistry(queue=command_queue(queue_redis)).get_job_ids()
