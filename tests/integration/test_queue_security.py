"""Only RQ's JSON serializer is accepted: a pickled job is refused, never executed."""

from __future__ import annotations

import json
import zlib

import fakeredis
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


PROBE = "/tmp/fleet-foreign-job-ran"


def touch_probe(*_: object, **__: object) -> None:
    """What a foreign job asks a worker to run: leaves a mark if it ever runs."""
    with open(PROBE, "w", encoding="utf-8") as mark:
        mark.write("ran")


@pytest.mark.parametrize("attached", ["named function", "success callback", "failure callback"])
def test_a_job_that_is_not_a_decide_job_is_refused_and_nothing_it_names_runs(
        store: EventStore, queue_redis: Redis, attached: str) -> None:
    """JSON rules out pickle, not a job naming any importable function (or callback) for RQ to
    call: whoever can write to the queue could run code in a worker."""
    import os

    from rq import Callback

    if os.path.exists(PROBE):
        os.remove(PROBE)
    queue = command_queue(queue_redis)
    probe = f"{__name__}.touch_probe"
    if attached == "named function":
        job = queue.enqueue(probe)
    elif attached == "success callback":
        job = queue.enqueue("workers.jobs.decide_commands", [], on_success=Callback(probe))
    else:
        job = queue.enqueue("workers.jobs.decide_commands", "not a list",
                            on_failure=Callback(probe))
    head = store.head()
    forking = not isinstance(queue_redis, fakeredis.FakeRedis)
    work(queue_redis, [queue.name], burst=True, forking=forking)
    assert not os.path.exists(PROBE), f"a foreign job's {attached} ran"
    assert store.head() == head
    assert job.id in FailedJobRegistry(queue=queue).get_job_ids()
    failed = queue.fetch_job(job.id)
    assert failed is not None and failed.latest_result() is not None
    why = failed.latest_result().exc_string or ""  # type: ignore[union-attr]
    assert ("a worker runs only" if attached == "named function" else "callbacks") in why
