"""Explain one operation: every request made under its key, its six steps, its evidence (as
admitted and as it stands now), what reached the provider and every budget movement."""

from __future__ import annotations

from typing import Any

from controlplane.errors import InputError
from controlplane.state import gateway as gw
from controlplane.state.fold import reading
from events.model import RecordedEvent
from events.projections import SqlProjections
from events.store import EventStore


def _entry(event: RecordedEvent) -> dict[str, Any]:
    with reading(event):
        return _timeline_entry(event)


def _timeline_entry(event: RecordedEvent) -> dict[str, Any]:
    data = event.data
    result = data.get("result") or {}
    entry: dict[str, Any] = {
        "position": event.position, "event_type": event.event_type, "event_id": event.event_id,
        "command_id": event.command_id, "actor": event.actor, "tenant": event.tenant,
        "occurred_at": event.occurred_at, "outcome": data.get("outcome"),
        "codes": [reason["code"] for reason in data.get("reasons", [])],
        "observed": bool(data.get("observed"))}
    if "step" in result:
        entry["step"] = result["step"]
    return entry


def _denial(event: RecordedEvent) -> dict[str, Any]:
    with reading(event):
        return {"position": event.position, "step": event.data["result"]["step"],
                "code": event.data["result"]["code"], "command_id": event.command_id}


def _movement(event: RecordedEvent) -> dict[str, Any]:
    result = event.data["result"]
    return {"position": event.position, "event_type": event.event_type,
            "outcome": event.data["outcome"], "grant_units": result.get("grant_units"),
            "committed_units": result.get("committed_units", 0),
            "released_units": result.get("released_units", 0),
            "before": result.get("before"), "after": result.get("after")}


def explain_operation(store: EventStore, tenant: str, idempotency_key: str) -> dict[str, Any]:
    """Everything the log knows about (tenant, key); InputError when nothing was ever requested."""
    events = store.read_stream(gw.operation_stream(tenant, idempotency_key))
    if not events:
        raise InputError(f"no request was ever made under key {idempotency_key!r} of tenant {tenant!r}")
    with store.engine.connect() as conn:
        projections = SqlProjections(conn)
        operation = projections.get(gw.OPERATIONS, gw.operation_key(tenant, idempotency_key))
        sources = {ref["source_ref"]: projections.get(gw.REGISTRIES["source"], ref["source_ref"])
                   for ref in (operation or {}).get("evidence", [])}
    reserved = next((e for e in events if e.event_type == gw.OPERATION_RESERVED), None)
    report: dict[str, Any] = {
        "tenant": tenant, "idempotency_key": idempotency_key,
        "stream_id": gw.operation_stream(tenant, idempotency_key),
        "timeline": [_entry(e) for e in events],
        "denials": [_denial(e) for e in events if e.event_type == gw.DISPATCH_DENIED],
        "operation": None, "steps": [], "evidence": [], "budget": [], "adapter": None}
    if operation is None or reserved is None:
        return report
    report["operation"] = {k: operation.get(k) for k in (
        "operation_id", "state", "outcome_code", "dispatch_count", "release_id", "profile_id",
        "route_id", "adapter_kind", "pool", "network_policy", "input_tokens", "max_output_tokens",
        "grant_units", "budget_id", "replays")}
    with reading(reserved):
        report["steps"] = reserved.data["result"]["steps"]
    report["evidence"] = [
        {"source_ref": ref["source_ref"], "admitted_version": ref["version"],
         "current_version": (sources.get(ref["source_ref"]) or {}).get("current_version"),
         "active_now": (sources.get(ref["source_ref"]) or {}).get("active", False)}
        for ref in operation["evidence"]]
    report["budget"] = []
    # Read in chunks: a budget's stream holds every dispatch charged to it.
    for event in store.iter_stream(gw.budget_stream(operation["budget_id"])):
        if event.event_type in gw.BUDGET_EVENTS:
            with reading(event):
                if event.data["result"].get("operation_id") == operation["operation_id"]:
                    report["budget"].append(_movement(event))
    completed = next((e for e in events if e.event_type in (gw.OPERATION_COMPLETED,
                                                             gw.OPERATION_RECONCILED)), None)
    provider_request_id = None
    if completed is not None:
        with reading(completed):
            provider_request_id = completed.data["result"].get("provider_request_id")
    report["adapter"] = {
        "dispatch_count": operation["dispatch_count"], "route_id": operation["route_id"],
        "adapter_kind": operation["adapter_kind"],
        "provider_idempotency_key": operation["operation_id"],
        "provider_request_id": provider_request_id}
    return report
