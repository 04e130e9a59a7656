"""Replay: rebuilt projections equal the live ones; re-derivation is exact; what-if is precise."""

from __future__ import annotations

import json
from pathlib import Path

import fakeredis
import pytest

from controlplane.commands import command_adapter
from controlplane.policy_book import PolicyBook, load_overrides
from controlplane.replay import compare_with_live, rebuild_live, state_at, verify_decisions
from controlplane.service import accept
from controlplane.settings import Settings
from events.projections import load_all
from events.store import EventStore
from tests.factories import assess_memory
from workers.queue import enqueue_commands
from workers.runner import work


def decide_through_the_queue(store: EventStore, payloads: list[dict]) -> None:
    connection = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    accepted = accept(store, [command_adapter.validate_python(p) for p in payloads])
    enqueue_commands(connection, Settings(batch_size=250), accepted)
    work(connection, [Settings.from_env().command_queue], burst=True, forking=False)


def thousand_commands() -> list[dict]:
    # Context lengths sweep across the fit boundary; half leave usable_fraction to the policy.
    return [assess_memory(f"r{i:04d}", max_live_tokens=1_024 + 64 * (i % 100),
                          usable_fraction=None if i % 2 else 0.95, model_name=f"m{i % 37}")
            for i in range(1_000)]


@pytest.fixture
def decided_store(store: EventStore) -> EventStore:
    decide_through_the_queue(store, thousand_commands())
    return store


@pytest.mark.slow
def test_dropping_and_rebuilding_the_projections_gives_the_same_state(
        decided_store: EventStore) -> None:
    with decided_store.engine.connect() as conn:
        before = load_all(conn)
    assert before["memory_fit"], "the decisions projected nothing"
    head = decided_store.head()[0]
    assert rebuild_live(decided_store) == head >= 2_000
    rebuilt = decided_store.read_all(from_position=head)
    assert [e.event_type for e in rebuilt] == ["ProjectionsRebuilt"]  # recorded, folds to nothing
    with decided_store.engine.connect() as conn:
        assert load_all(conn) == before
    assert compare_with_live(decided_store) == []


@pytest.mark.slow
def test_verify_reports_no_drift_after_a_thousand_decisions(decided_store: EventStore) -> None:
    report = verify_decisions(decided_store)
    assert report.decisions_checked == 1_000
    assert report.drifts == []


@pytest.mark.slow
def test_a_substituted_policy_parameter_lists_exactly_the_decisions_it_changes(
        decided_store: EventStore, tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"memory": {"usable_fraction": 0.6}}))
    report = verify_decisions(decided_store, PolicyBook(load_overrides(policy_file)))
    changed = {d.command_id for d in report.drifts}
    # Exactly the commands that left usable_fraction to the policy can change; those that
    # named their own fraction are untouched by a policy substitution.
    left_to_policy = {p["command_id"] for p in thousand_commands()
                      if "usable_fraction" not in p["deployment"]}
    assert changed == left_to_policy
    flipped = [d for d in report.drifts if d.recorded["outcome"] != d.rederived["outcome"]]
    assert flipped and all(d.rederived["outcome"] == "does_not_fit" for d in flipped)
    assert all("result" in d.changed_fields for d in report.drifts)
    assert verify_decisions(decided_store).drifts == []  # the live log is untouched


def test_status_at_a_position_equals_the_state_after_replaying_to_it(store: EventStore) -> None:
    decide_through_the_queue(store, thousand_commands()[:40])
    for position in (1, 40, 55, 80):
        folded = state_at(store, position).snapshot()
        by_hand: dict = {}
        for event in store.read_all(to_position=position):
            if event.event_type == "MemoryAssessed":
                by_hand[event.data["inputs"]["model_name"]] = event.data["result"]["fits"]
        assert {k: v["fits"] for k, v in folded.get("memory_fit", {}).items()} == by_hand
