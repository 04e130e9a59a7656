"""Job functions: ids in, handler call, nothing else. RQ imports them by dotted path."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Annotated, Any

import structlog
from pydantic import Field, TypeAdapter, ValidationError
from rq import get_current_job

from controlplane.commands.base import CommandId
from controlplane.errors import InputError
from controlplane.runtime import store_for_process
from controlplane.service import decide
from controlplane.settings import MAX_BATCH_SIZE, Settings
from workers.queue import RESUME, enqueue_commands

log = structlog.get_logger(__name__)
MAX_IDS_PER_JOB = MAX_BATCH_SIZE  # a job carries at most one batch (FLEET_BATCH_SIZE)
# How long one job runs outside effects before handing the rest to another (at most half its
# timeout): well inside the gateway's default reservation lease (900 s).
EFFECTS_BUDGET_SECONDS = 60.0


_JOB_ARGUMENT: TypeAdapter[list[str]] = TypeAdapter(
    Annotated[list[CommandId], Field(max_length=MAX_IDS_PER_JOB)])


class JobRefused(RuntimeError):
    """A dequeued job that is not one of ours (`workers.queue.job_problem`)."""


def refuse_job(reason: str) -> None:
    """What a disarmed job runs instead of what it named: it fails, saying why."""
    raise JobRefused(reason)


def decide_commands(command_ids: list[str]) -> dict[str, Any]:
    """Decide a batch of accepted commands; a command already decided appends nothing.

    Anything but a bounded list of command ids is refused with `InputError`, writing nothing.
    """
    try:
        command_ids = _JOB_ARGUMENT.validate_python(command_ids, strict=True)
    except ValidationError as error:
        raise InputError(f"a decide job takes a list of at most {MAX_IDS_PER_JOB} command ids: "
                         f"{error.error_count()} problem(s)") from None
    started = time.monotonic()
    job = get_current_job()
    bound = log.bind(job_pid=os.getpid(), batch_size=len(command_ids),
                     job_id=job.id if job is not None else None)
    settings = Settings.from_env()
    if job is not None and job.origin:  # follow-ups go to the queue this job came from
        settings = dataclasses.replace(settings, queues=(job.origin,))

    def enqueue_follow_ups(ids: list[str]) -> None:
        if job is not None:
            enqueue_commands(job.connection, settings, ids)

    def hand_off(ids: list[str]) -> None:
        assert job is not None
        enqueue_commands(job.connection, settings, ids, kind=RESUME)

    store = store_for_process(settings)
    waited, held = store.lock_wait_seconds, store.lock_held_seconds
    # Outside calls (the gateway's) run one after another: past half the job's timeout, or a
    # minute, the rest go to a job of their own, so none is cut off by the timeout, waits out
    # its reservation's lease behind the others, or keeps idle workers from sharing them.
    timeout = (job.timeout if job is not None else None) or settings.job_timeout_seconds
    outcomes = decide(store, command_ids, enqueue=enqueue_follow_ups,
                      effects_until=started + min(timeout / 2, EFFECTS_BUDGET_SECONDS),
                      hand_off=hand_off if job is not None else None)
    decided_now = sum(1 for outcome in outcomes if outcome.decided_now)
    # Left for after the commands they reference are decided, enqueued again behind them.
    waiting = sum(1 for outcome in outcomes if outcome.waits_for)
    already = len(outcomes) - decided_now - waiting
    # How long the batch waited for the append lock and held it: other workers wait that long.
    bound.info("batch_decided", decided_now=decided_now, already_decided=already,
               waiting_for_creators=waiting,
               lock_wait_ms=round(1000 * (store.lock_wait_seconds - waited), 1),
               lock_held_ms=round(1000 * (store.lock_held_seconds - held), 1))
    return {"decided_now": decided_now, "already_decided": already,
            "waiting_for_creators": waiting}
