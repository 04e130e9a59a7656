"""Enqueue accepted commands as bounded batches of ids, with RQ's JSON serializer."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from redis import Redis
from rq import Queue, Retry
from rq.serializers import JSONSerializer

from controlplane.settings import Settings

RETRY = Retry(max=3, interval=[1, 5, 30])
# By dotted path: the job module imports this one to enqueue follow-up commands.
DECIDE_JOB = "workers.jobs.decide_commands"


def command_queue(connection: Redis, name: str | None = None) -> Queue:
    """The command queue (`FLEET_QUEUE`, by default `fleet-commands`); jobs are JSON, never pickle."""
    return Queue(name or Settings.from_env().command_queue, connection=connection,
                 serializer=JSONSerializer)


def batch_job_id(queue_name: str, command_ids: Sequence[str]) -> str:
    """A job id derived from the queue and the batch's command ids: re-enqueueing names one job."""
    digest = hashlib.sha256("\n".join(command_ids).encode()).hexdigest()[:40]
    return f"decide-{queue_name}-{digest}"


def enqueue_commands(connection: Redis, settings: Settings, command_ids: Sequence[str]) -> list[str]:
    """Enqueue `command_ids` in batches of `settings.batch_size`; returns the job ids."""
    queue = command_queue(connection, settings.command_queue)
    batches = [list(command_ids[i:i + settings.batch_size])
               for i in range(0, len(command_ids), settings.batch_size)]
    jobs = [
        Queue.prepare_data(
            DECIDE_JOB, args=(batch,), job_id=batch_job_id(queue.name, batch),
            timeout=settings.job_timeout_seconds, result_ttl=settings.result_ttl_seconds,
            failure_ttl=settings.failure_ttl_seconds, retry=RETRY,
            description=f"decide {len(batch)} command(s)")
        for batch in batches
    ]
    if not jobs:
        return []
    with connection.pipeline() as pipe:
        queue.enqueue_many(jobs, pipeline=pipe)
        pipe.execute()
    return [job.job_id for job in jobs if job.job_id is not None]
