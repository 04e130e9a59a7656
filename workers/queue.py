"""Enqueue accepted commands as bounded batches of ids, with RQ's JSON serializer."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Sequence

from redis import Redis
from rq import Queue, Retry, Worker
from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from controlplane.settings import Settings
from workers.processes import alive

RETRY = Retry(max=3, interval=[1, 5, 30])
# By dotted path: the job module imports this one to enqueue follow-up commands.
DECIDE_JOB = "workers.jobs.decide_commands"
REFUSE_JOB = "workers.jobs.refuse_job"
# The kind of job that resumes decided commands' calls another job handed off.
RESUME = "resume"


def job_problem(job: Job) -> str | None:
    """Why a dequeued job is not one `enqueue_commands` makes; None if it is.

    RQ imports and calls whatever function a job names (JSON rules out pickle, not that), and
    runs its callbacks and webhooks: whoever can write to the queue could run any code in a
    worker. A worker runs only `DECIDE_JOB` with one list argument, nothing else attached.
    Callback names are read, never imported (reading RQ's attribute imports the function).
    """
    try:
        func_name, instance, args, kwargs = job.func_name, job.instance, job.args, job.kwargs
    except Exception as error:  # not JSON (a pickle), or not a job's shape
        return f"the job cannot be read as JSON: {type(error).__name__}"
    if func_name != DECIDE_JOB:
        return f"the job names {func_name!r}; a worker runs only {DECIDE_JOB}"
    if instance is not None or kwargs or len(args) != 1:
        return "the job does not carry exactly one list of command ids"
    callbacks = (job._success_callback_name, job._failure_callback_name,  # noqa: SLF001
                 job._stopped_callback_name)  # noqa: SLF001
    if any(callbacks) or job.webhooks:
        return "the job carries callbacks or webhooks"
    return None


def disarm(job: Job, problem: str) -> None:
    """Make `job` one that fails at once, saying why, with nothing attached and no retry."""
    job.func_name, job.instance, job.args, job.kwargs = REFUSE_JOB, None, (problem,), {}
    job._success_callback_name = job._failure_callback_name = None  # noqa: SLF001
    job._stopped_callback_name = None  # noqa: SLF001
    job.webhooks, job.retries_left = [], None


def command_queue(connection: Redis, name: str | None = None) -> Queue:
    """The command queue (`FLEET_QUEUE`, by default `fleet-commands`); jobs are JSON, never pickle."""
    return Queue(name or Settings.from_env().command_queue, connection=connection,
                 serializer=JSONSerializer)


def workers_serving(connection: Redis, name: str) -> int:
    """How many RQ workers listen on the queue `name` (they register themselves in Redis)."""
    return Worker.count(connection=connection, queue=command_queue(connection, name))


def batch_job_id(queue_name: str, command_ids: Sequence[str], kind: str = "decide") -> str:
    """A job id derived from the queue and the batch's command ids: re-enqueueing names one job.
    `kind` `RESUME` names a job of decided commands whose effects another job handed off (never
    the id of the job handing them off, which may carry the same ids); it is queued at the
    front."""
    digest = hashlib.sha256("\n".join(command_ids).encode()).hexdigest()[:40]
    return f"{kind}-{queue_name}-{digest}"


def resumes(job_id: str) -> bool:
    """Whether `job_id` names a job resuming calls another job handed off (`batch_job_id`)."""
    return job_id.startswith(f"{RESUME}-")


def in_batches(command_ids: Sequence[str], size: int) -> list[list[str]]:
    """`command_ids` in order, in batches of at most `size`: a job each."""
    return [list(command_ids[i:i + size]) for i in range(0, len(command_ids), size)]


def not_in_a_job(connection: Redis, settings: Settings, command_ids: Sequence[str]) -> list[str]:
    """`command_ids` but those of batches whose job (as `enqueue_commands` would name it) is
    still queued or running: enqueued again, it would be delivered, and its commands read,
    once more. (Every batch but the last is full, so what is left batches as it did.)

    A job RQ still counts as started whose worker ran on this machine and is gone (killed with
    SIGKILL) is not running: RQ forgets it only when its heartbeat lapses, a minute or more,
    and `reconcile` had re-enqueued nothing meanwhile."""
    queue = command_queue(connection, settings.command_queue)
    started = [job_id for job_id in StartedJobRegistry(queue=queue).get_job_ids()
               if not _worker_gone_from_here(connection, job_id)]
    present = {*queue.get_job_ids(), *started}
    return [command_id for batch in in_batches(command_ids, settings.batch_size)
            if batch_job_id(queue.name, batch) not in present for command_id in batch]


def _worker_gone_from_here(connection: Redis, job_id: str) -> bool:
    """Whether the worker running `job_id` says it runs on this machine, under a pid that no
    longer runs here. Anything unknown (another host, no record) counts as running."""
    worker_name = _text(connection.hget(Job.key_for(job_id), "worker_name"))
    if not worker_name:
        return False
    hostname, pid = map(_text, connection.hmget(Worker.redis_worker_namespace_prefix + worker_name,
                                                ["hostname", "pid"]))
    if hostname != socket.gethostname() or pid is None or not pid.isdigit():
        return False
    return not alive(int(pid))


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def enqueue_commands(connection: Redis, settings: Settings, command_ids: Sequence[str],
                     kind: str = "decide") -> list[str]:
    """Enqueue `command_ids` in batches of `settings.batch_size`; returns the job ids."""
    queue = command_queue(connection, settings.command_queue)
    batches = in_batches(command_ids, settings.batch_size)
    jobs = [
        Queue.prepare_data(
            DECIDE_JOB, args=(batch,), job_id=batch_job_id(queue.name, batch, kind),
            timeout=settings.job_timeout_seconds, result_ttl=settings.result_ttl_seconds,
            failure_ttl=settings.failure_ttl_seconds, retry=RETRY,
            description=f"decide {len(batch)} command(s)",
            # Calls handed off by a job go ahead of the queue: their reservations' leases run.
            at_front=kind == RESUME)
        for batch in batches
    ]
    if not jobs:
        return []
    with connection.pipeline() as pipe:
        queue.enqueue_many(jobs, pipeline=pipe)
        pipe.execute()
    return [job.job_id for job in jobs if job.job_id is not None]
