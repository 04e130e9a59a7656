"""A RegisterModel decision re-derives from the log alone, never from today's catalog files.

The catalog entry a registration used, or why it could not be read, is recorded in its inputs
(`outside_reads`); `replay --verify` and what-if `replay --policy` take it from there. So a
catalog figure changed since, a catalog gone, or one readable again after a rejection, is no
drift. A registration recorded before entries were recorded has none, and re-derives by reading
today's catalog: unchanged when the catalog is, an upgrade's drift (exit 0) when not.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controlplane import handlers
from controlplane.catalog.registry import FIXTURES_ENV, fixtures_dir, load_catalog
from controlplane.decisions import OUTSIDE_READS, DecisionContext
from controlplane.handlers.fleet import RULES_VERSIONS
from controlplane.policy_book import PolicyBook, load_overrides
from controlplane.replay import compare_with_live
from controlplane.replay.verify import verify_decisions
from events.store import EventStore
from tests.cli_helpers import run_cli
from tests.factories import register_model
from tests.fleet_helpers import decision, run

pytestmark = pytest.mark.usefixtures("embedded_queue")

LLAMA = "meta-llama/Llama-3.1-8B"
UNKNOWN = "acme/Llama-3.1-8B-Remix"


def catalog_copy(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the fixtures whose `catalog/models.json` `edit` changed."""
    copy = tmp_path / "fixtures"
    shutil.copytree(fixtures_dir() / "catalog", copy / "catalog")
    models_file = copy / "catalog" / "models.json"
    document = json.loads(models_file.read_text(encoding="utf-8"))
    edit(document["models"])
    models_file.write_text(json.dumps(document), encoding="utf-8")
    return copy


def one_more_parameter(models: dict[str, Any]) -> None:
    models[LLAMA]["parameters"]["total"] += 1


def assert_verifies_identical(store: EventStore) -> None:
    """No drift, under the library call and under `fleetctl replay --verify` (exit 0)."""
    report = verify_decisions(store)
    assert report.decisions_checked == 1 and report.drifts == []
    result = run_cli("replay", "--verify")
    assert result.exit_code == 0, result.output
    assert "identical" in result.output


def test_a_registration_re_derives_unchanged_after_its_catalog_figure_changes(
        store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run(store, register_model("llama", LLAMA))
    registered = decision(store, "model-llama")
    total = registered.data["result"]["memory"]["parameters"]
    assert registered.data["rules_version"] == RULES_VERSIONS["RegisterModel"]
    monkeypatch.setenv(FIXTURES_ENV, str(catalog_copy(tmp_path, one_more_parameter)))
    assert load_catalog().model(LLAMA).parameters.total == total + 1  # the change is read
    assert_verifies_identical(store)
    assert compare_with_live(store) == []


def test_a_registration_re_derives_unchanged_when_the_catalog_is_gone(
        store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run(store, register_model("llama", LLAMA))
    monkeypatch.setenv(FIXTURES_ENV, str(tmp_path / "nonexistent"))
    assert_verifies_identical(store)
    assert compare_with_live(store) == []


def test_a_rejection_for_an_unreadable_catalog_stays_a_rejection(
        store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as unreadable:
        unreadable.setenv(FIXTURES_ENV, str(tmp_path / "nonexistent"))
        run(store, register_model("llama", LLAMA))
    rejected = decision(store, "model-llama")
    assert rejected.event_type == "CommandRejected"
    assert [r["code"] for r in rejected.data["reasons"]] == ["catalog_unreadable"]
    recorded = rejected.data["inputs"][OUTSIDE_READS][f"catalog:{LLAMA}"]
    assert recorded["error"]["code"] == "catalog_unreadable"
    assert_verifies_identical(store)  # with the repository's catalog, readable again
    assert compare_with_live(store) == []


def test_a_rejection_for_an_unknown_id_stays_one_once_the_catalog_has_it(
        store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run(store, register_model("remix", UNKNOWN))
    rejected = decision(store, "model-remix")
    assert [r["code"] for r in rejected.data["reasons"]] == ["unknown_model"]

    def add_the_id(models: dict[str, Any]) -> None:
        models[UNKNOWN] = models[LLAMA]

    monkeypatch.setenv(FIXTURES_ENV, str(catalog_copy(tmp_path, add_the_id)))
    assert load_catalog().model(UNKNOWN).model_id == UNKNOWN  # today it would register
    assert_verifies_identical(store)


def test_a_registration_records_the_entry_it_used_and_no_more(store: EventStore) -> None:
    run(store, register_model("llama", LLAMA), {**register_model("llama4", LLAMA),
                                                "weight_bits": 4})
    for command_id, bits in (("model-llama", 16), ("model-llama4", 4)):
        data = decision(store, command_id).data
        entry = data["inputs"][OUTSIDE_READS][f"catalog:{LLAMA}"]["value"]
        memory = data["result"]["memory"]
        assert entry["model_id"] == LLAMA
        assert {key: memory[key] for key in entry if key in memory} == {
            key: entry[key] for key in entry if key in memory}
        assert memory["weight_bits"] == bits
        # The checkpoint's precision is read only when the command leaves it to the catalog.
        assert ("checkpoint_bits" in entry) == (bits == 16)
        assert set(entry) <= {"model_id", "parameters", "layers", "kv_heads", "head_dim",
                              "kv_latent_dim", "checkpoint_bits", "attention_heads"}
        # The heads a tensor-parallel width must split, recorded with the model it registers.
        assert data["result"]["attention_heads"] == entry["attention_heads"] == 32


def test_a_registration_recorded_before_attention_heads_were_read_re_derives_unchanged(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rules version 3 read no attention heads from the catalog: its recorded entry lacks
    them, and re-derived from that entry the registration is what was recorded."""
    from controlplane.handlers import fleet

    original = fleet._catalog_entry
    with monkeypatch.context() as older:  # only this: undo() would unset FLEET_DATABASE_URL too
        older.setattr(fleet, "_catalog_entry", lambda catalog_id, bits: {
            key: value for key, value in original(catalog_id, bits).items()
            if key != "attention_heads"})
        run(store, register_model("llama", LLAMA))
    assert "attention_heads" not in decision(store, "model-llama").data["result"]
    assert_verifies_identical(store)


def test_a_what_if_replay_reads_the_recorded_entry_not_the_catalog(
        store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run(store, register_model("llama", LLAMA))
    monkeypatch.setenv(FIXTURES_ENV, str(catalog_copy(tmp_path, one_more_parameter)))
    what_if = tmp_path / "what-if.json"
    what_if.write_text(json.dumps({"memory": {"usable_fraction": 0.5}}))
    report = verify_decisions(store, PolicyBook(load_overrides(what_if)))
    assert report.decisions_checked == 1 and report.drifts == []
    result = run_cli("replay", "--policy", str(what_if), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["drifts"] == []


def record_as_before_entries_were_recorded(store: EventStore, monkeypatch: pytest.MonkeyPatch,
                                           *payloads: dict[str, Any]) -> None:
    """Decide `payloads` as rules version 2 did: the catalog read at decision time, nothing of
    it recorded."""
    with monkeypatch.context() as old_rules:
        old_rules.setitem(handlers.RULES_VERSIONS, "RegisterModel", 2)
        old_rules.setattr(DecisionContext, "read_outside",
                          lambda self, key, read: read())
        run(store, *payloads)


def test_a_registration_recorded_before_entries_were_recorded_re_derives_unchanged(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    record_as_before_entries_were_recorded(store, monkeypatch, register_model("llama", LLAMA))
    recorded = decision(store, "model-llama").data
    assert recorded["rules_version"] == 2 and OUTSIDE_READS not in recorded["inputs"]
    assert_verifies_identical(store)


def test_an_older_registration_whose_catalog_changed_drifts_as_an_upgrade(
        store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It has no entry recorded: replay reads today's catalog, as the rules that made it did."""
    record_as_before_entries_were_recorded(store, monkeypatch, register_model("llama", LLAMA))
    monkeypatch.setenv(FIXTURES_ENV, str(catalog_copy(tmp_path, one_more_parameter)))
    report = verify_decisions(store)
    assert [(d.command_id, d.rules_version, d.current_rules_version) for d in report.drifts] == [
        ("model-llama", 2, RULES_VERSIONS["RegisterModel"])]
    assert report.unexplained == []
    result = run_cli("replay", "--verify")
    assert result.exit_code == 0, result.output
