"""Two databases sharing a Redis never share a queue: a worker, `submit` or `reconcile` of another
log is refused (exit 2, naming FLEET_QUEUE) while a log's workers claim the queue, before anything
is written or enqueued.

Before, workers of another database on the same queue took this one's jobs and skipped every
command as unknown; the commands waited in the inbox for a reconcile.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from redis import Redis

from controlplane.errors import InputError
from controlplane.runtime import open_store
from tests.cli_helpers import run_cli
from tests.factories import assess_memory
from tests.fleet_helpers import log_size
from workers.claims import CLAIM_SECONDS, QueueClaim, check_claim, claim, claim_key


def submit_one(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.jsonl"
    path.write_text(json.dumps(assess_memory(name)) + "\n")
    return path


@pytest.fixture
def claimed_by_another_log(real_redis: Redis) -> str:
    """The test's queue, claimed by a log other than any this test writes."""
    queue = os.environ["FLEET_QUEUE"]
    real_redis.set(claim_key(queue), "0" * 64, ex=CLAIM_SECONDS)
    return queue


def test_a_queue_claimed_for_one_log_refuses_another_and_accepts_its_own(
        real_redis: Redis) -> None:
    queue = os.environ["FLEET_QUEUE"]
    claim(real_redis, [queue], "a" * 64)
    check_claim(real_redis, queue, "a" * 64)
    check_claim(real_redis, queue, None)  # an empty log names no log yet
    with pytest.raises(InputError, match="FLEET_QUEUE: the queue .* another database's log"):
        claim(real_redis, [queue], "b" * 64)
    assert 0 < real_redis.ttl(claim_key(queue)) <= CLAIM_SECONDS  # it lapses with its workers
    real_redis.delete(claim_key(queue))
    claim(real_redis, [queue], "b" * 64)


@pytest.mark.parametrize("command", [["submit", "LATER"], ["reconcile"], ["worker", "--burst"]])
def test_another_logs_submit_reconcile_and_worker_are_refused_before_writing(
        tmp_path: Path, sqlite_url: str, real_redis: Redis, command: list[str]) -> None:
    assert run_cli("submit", str(submit_one(tmp_path, "own"))).exit_code == 0  # queue free
    real_redis.set(claim_key(os.environ["FLEET_QUEUE"]), "0" * 64, ex=CLAIM_SECONDS)
    before = log_size(sqlite_url)
    args = [str(submit_one(tmp_path, "later")) if arg == "LATER" else arg for arg in command]
    result = run_cli(*args)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: FLEET_QUEUE: the queue ")
    assert len(result.stderr.splitlines()) == 1
    assert log_size(sqlite_url) == before


def test_an_empty_logs_first_submit_is_not_enqueued_on_another_logs_queue(
        tmp_path: Path, sqlite_url: str, real_redis: Redis) -> None:
    """An empty log has no name until its first events: they are recorded, then not enqueued
    where another database's workers would take them."""
    queue = os.environ["FLEET_QUEUE"]
    real_redis.set(claim_key(queue), "0" * 64, ex=CLAIM_SECONDS)
    result = run_cli("submit", str(submit_one(tmp_path, "first")))
    assert result.exit_code == 3, result.stderr  # written: not "bad input, nothing written"
    assert "1 command(s) are recorded in the inbox, undecided" in result.stderr
    assert real_redis.llen(f"rq:queue:{queue}") == 0


def test_a_worker_claims_its_queue_for_its_log_and_renews_the_claim(
        tmp_path: Path, sqlite_url: str, real_redis: Redis) -> None:
    queue = os.environ["FLEET_QUEUE"]
    assert run_cli("submit", str(submit_one(tmp_path, "own"))).exit_code == 0
    assert run_cli("worker", "--burst").exit_code == 0
    store = open_store(sqlite_url)
    log_id = store.log_id()
    assert log_id is not None and real_redis.get(claim_key(queue)) == log_id.encode()
    real_redis.delete(claim_key(queue))
    renewal = QueueClaim(real_redis, [queue], store.log_id)
    renewal.renewed_at = float("-inf")
    renewal.renew()
    assert real_redis.get(claim_key(queue)) == log_id.encode()
    real_redis.set(claim_key(queue), "0" * 64)
    renewal.renewed_at = float("-inf")
    renewal.renew()  # another log's by now: logged, never raised out of a heartbeat
    assert real_redis.get(claim_key(queue)) == b"0" * 64
    store.engine.dispose()
