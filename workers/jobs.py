"""Job functions: ids in, handler call, nothing else. RQ imports them by dotted path."""

from __future__ import annotations

import os
from typing import Any

import structlog

from controlplane.runtime import store_for_process
from controlplane.service import decide

log = structlog.get_logger(__name__)


def decide_commands(command_ids: list[str]) -> dict[str, Any]:
    """Decide a batch of accepted commands; a command already decided appends nothing."""
    bound = log.bind(job_pid=os.getpid(), batch_size=len(command_ids))
    outcomes = decide(store_for_process(), command_ids)
    decided_now = sum(1 for outcome in outcomes if outcome.decided_now)
    bound.info("batch_decided", decided_now=decided_now, already_decided=len(outcomes) - decided_now)
    return {"decided_now": decided_now, "already_decided": len(outcomes) - decided_now}
