"""Explaining an operation, strict gateway commands, and the registries' own rules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane.commands.gateway import (
    CreateReleaseBundle,
    MoveReleasePointer,
    ReconcileOperation,
    RegisterSource,
)
from controlplane.errors import InputError
from controlplane.gateway.explain import explain_operation
from controlplane.gateway.fixture_provider import FIXTURE_DIR_ENV, Fault, FixtureProvider
from controlplane.gateway.scenario import GatewayDriver, common_fixture, dispatch, route
from controlplane.runtime import open_store
from controlplane.settings import Settings
from tests.cli_helpers import run_cli


@pytest.fixture
def gateway(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) \
        -> Iterator[GatewayDriver]:
    monkeypatch.setenv(FIXTURE_DIR_ENV, str(tmp_path / "provider"))
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    store = open_store(sqlite_url)
    driver = GatewayDriver(Settings.from_env(), store, FixtureProvider(tmp_path / "provider"))
    driver.run(*common_fixture())
    yield driver
    store.engine.dispose()


def last_codes(gateway: GatewayDriver, stream: str) -> list[str]:
    return [r["code"] for r in gateway.store.read_stream(stream)[-1].data["reasons"]]


def test_explain_shows_denials_steps_evidence_budget_and_the_single_call(
        gateway: GatewayDriver) -> None:
    gateway.run(route("sh-1", ready=False))
    gateway.send(dispatch("alice", "kx"))
    gateway.run(route("sh-1"))
    gateway.provider.script(Fault("timeout_after_send", idempotency_key="kx"))
    gateway.send(dispatch("alice", "kx"))
    gateway.send(dispatch("alice", "kx"))
    gateway.run(ReconcileOperation(tenant="acme", idempotency_key="kx", resolution="completed",
                                   evidence_ref="provider:selfhost-1", answer_text="found it",
                                   output_tokens=56))
    report = explain_operation(gateway.store, "acme", "kx")
    assert report["denials"][0]["step"] == "select" and report["denials"][0]["code"] == "route_not_ready"
    assert [e["event_type"] for e in report["timeline"]] == [
        "DispatchDenied", "OperationReserved", "OperationDispatching", "OperationOutcomeUnknown",
        "OperationReplayed", "OperationReconciled"]
    assert [e["actor"] for e in report["timeline"]][3] == "gateway-executor"
    assert {e["tenant"] for e in report["timeline"]} == {"acme"}
    assert [s["step"] for s in report["steps"]] == ["authorise", "select", "authorise", "select",
                                                    "bound", "reserve"]
    assert report["operation"]["state"] == "completed" and report["operation"]["replays"] == 1
    assert report["evidence"] == [
        {"source_ref": "doc-a", "admitted_version": 3, "current_version": 3, "active_now": True},
        {"source_ref": "doc-b", "admitted_version": 1, "current_version": 1, "active_now": True}]
    movements = [(m["event_type"], m["grant_units"], m["committed_units"], m["released_units"])
                 for m in report["budget"]]
    assert movements == [("BudgetReserved", 356, 0, 0), ("BudgetReconciled", 356, 156, 200)]
    assert report["budget"][-1]["after"]["committed_units"] == 156
    assert report["adapter"]["dispatch_count"] == 1 and gateway.calls(key="kx") == 1


def test_explain_of_a_key_never_used_is_an_input_error(gateway: GatewayDriver) -> None:
    with pytest.raises(InputError):
        explain_operation(gateway.store, "acme", "never")


def test_fleetctl_explain_by_dispatch_command_id_shows_the_decision_and_its_observation(
        gateway: GatewayDriver) -> None:
    command = dispatch("alice", "kcli")
    gateway.send(command)
    result = run_cli("explain", command.command_id, "--json")
    assert result.exit_code == 0, result.stderr
    types = [step["event_type"] for step in json.loads(result.output)["chain"]]
    # The decision (reserve the operation and its grant), then what its effect recorded: the
    # mark just before the call, the answer and the settlement.
    assert types[:5] == ["OperationReserved", "BudgetReserved", "OperationDispatching",
                         "OperationCompleted", "BudgetSettled"]


def test_no_decision_or_audit_event_carries_the_prompt(gateway: GatewayDriver) -> None:
    secret = "confidential-" + "x" * 20
    gateway.send(dispatch("alice", "kp", text=secret + " tail"))
    gateway.send(dispatch("alice", "kp2", text=secret, max_output_tokens=5_000))
    for event in gateway.store.read_all():
        if event.event_type != "CommandAccepted":
            assert secret not in json.dumps(event.data), event.event_type


def test_a_malformed_dispatch_is_refused_at_submit_and_writes_nothing(
        gateway: GatewayDriver, tmp_path: Path) -> None:
    head = gateway.store.head()
    good = json.loads(dispatch("alice", "ok").model_dump_json())
    bad_lines = [
        {**good, "tenant": "acme/evil"},  # would alias another tenant's stream
        {**good, "idempotency_key": "a/b"},
        {**good, "idempotency_key": "k" * 256},
        {**good, "max_output_tokens": -1},
        {**good, "max_output_tokens": 1.5},
        {**good, "surprise": True},
        {**good, "capabilities_requested": ["text", "text"]},
        {**good, "network_preference": "public"},
    ]
    for payload in bad_lines:
        source = tmp_path / "bad.jsonl"
        source.write_text(json.dumps(payload))
        result = run_cli("submit", str(source))
        assert result.exit_code == 2, payload
    assert gateway.store.head() == head


def test_registries_refuse_what_a_tenant_does_not_own_and_bundles_never_change(
        gateway: GatewayDriver) -> None:
    gateway.run(CreateReleaseBundle(release_id="rel-1", profile_id="chat-large-v2",
                                    gate_status="approved"))
    assert last_codes(gateway, "release/rel-1") == ["release_bundle_immutable"]
    gateway.run(MoveReleasePointer(tenant="acme", pointer_name="acme/assistant", release_id="rel-2",
                                   expected_version=7))
    assert last_codes(gateway, "release-pointer/acme/assistant") == ["pointer_version_conflict"]
    gateway.run(RegisterSource(tenant="acme", source_ref="doc-a", version=2))
    assert last_codes(gateway, "source/doc-a") == ["source_version_regressed"]
    result = run_cli("submit", "-", input_text=RegisterSource(
        tenant="beta", source_ref="doc-a", version=9).model_dump_json())
    assert result.exit_code == 2 and "belongs to another tenant" in result.stderr
    assert gateway.send(dispatch("alice", "kreg"))["release_id"] == "rel-1"


def test_fleetctl_explain_of_an_operation_shows_its_steps_evidence_and_budget(
        gateway: GatewayDriver) -> None:
    command = dispatch("alice", "kop")
    gateway.send(command)
    result = run_cli("explain", f"operation/{command.tenant}/kop", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.output)
    assert report["operation"]["idempotency_key"] == "kop"
    assert [s["event_type"] for s in report["chain"]][:2] == ["OperationReserved",
                                                             "OperationDispatching"]


def test_fleetctl_explain_text_of_an_operation_shows_its_steps_evidence_calls_and_budget(
        gateway: GatewayDriver) -> None:
    # The text showed the event chain alone; the steps, evidence and budget were in --json only.
    command = dispatch("alice", "kop")
    gateway.send(command)
    result = run_cli("explain", f"operation/{command.tenant}/kop")
    assert result.exit_code == 0, result.stderr
    report = json.loads(run_cli("explain", f"operation/{command.tenant}/kop", "--json").output)
    explained = report["operation"]
    assert f"operation {explained['operation']['operation_id']}: completed" in result.output
    for step in explained["steps"]:
        assert f"    step {step['step']}: {step['outcome']}" in result.output
    for source in explained["evidence"]:
        assert f"    evidence {source['source_ref']} version {source['admitted_version']} (" \
            in result.output
    assert "    sent to the provider 1 time(s), request " in result.output
    assert len(explained["budget"]) >= 2
    for move in explained["budget"]:
        assert f"    budget #{move['position']} {move['event_type']}: grant " in result.output


def test_explain_text_names_each_route_ruled_out_and_by_what(gateway: GatewayDriver) -> None:
    gateway.run(route("sh-1", ready=False))
    gateway.send(dispatch("alice", "kr"))
    denied = gateway.store.read_stream("operation/acme/kr")[-1]
    result = run_cli("explain", denied.event_id)
    assert result.exit_code == 0, result.stderr
    rulings = next(r["facts"]["rulings"] for r in denied.data["reasons"] if "rulings" in r["facts"])
    ruled_out = {route_id: code for route_id, code in rulings.items() if code != "eligible"}
    assert ruled_out.get("sh-1") == "route_not_ready"
    for route_id, code in ruled_out.items():
        assert f"ruled out {route_id}: {code}" in result.output


def test_explain_of_an_operation_names_a_budget_event_changed_outside_fleetctl(
        gateway: GatewayDriver) -> None:
    # Before: a KeyError traceback (exit 1) from a budget row without its result.
    command = dispatch("alice", "kop")
    gateway.send(command)
    with gateway.store.engine.begin() as conn:
        conn.execute(text("UPDATE events SET data = '{\"outcome\": \"reserved\"}' "
                          "WHERE event_type = 'BudgetReserved'"))
    result = run_cli("explain", f"operation/{command.tenant}/kop")
    assert result.exit_code == 3, result.stderr
    assert "(BudgetReserved on budget/" in result.stderr and "cannot be read" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
