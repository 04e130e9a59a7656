"""Adapters: the one outside effect of a dispatch, a call to a hosted provider or a self-hosted pool.

An adapter either returns a result, raises `RefusedBeforeSend` when it can prove the request never
left (nothing was processed or billed), or raises anything else, which the executor treats as an
unknown outcome: the request may have been processed. The fixture adapters record every
invocation in the fixture provider's ledger *before* anything can go wrong, so a count of
ledger entries is a count of adapter calls.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from typing import Protocol

from controlplane.gateway.fixture_provider import ADAPTER_FAULTS, FixtureProvider, fixture_provider


@dataclass(frozen=True)
class AdapterRequest:
    """What a provider receives (spec §5.1 step 8): the input, the effective maximum output,
    the profile and model ids, the effective network policy, and `provider_idempotency_key`
    (derived from the operation) so a provider can deduplicate."""

    operation_id: str
    tenant: str
    idempotency_key: str
    route_id: str
    adapter_kind: str
    provider: str
    pool: str | None
    profile_id: str
    model_id: str
    input_text: str
    input_tokens: int
    max_output_tokens: int
    network_policy: str
    provider_idempotency_key: str


@dataclass(frozen=True)
class AdapterResult:
    text: str
    input_tokens: int
    output_tokens: int
    provider_request_id: str


class RefusedBeforeSend(Exception):
    """The request provably never reached the provider: nothing was processed or billed."""


class OutcomeUnknown(Exception):
    """The request may have been processed (a timeout or reset after sending)."""


class Adapter(Protocol):
    def call(self, request: AdapterRequest) -> AdapterResult: ...


class FixtureAdapter:
    """A scripted stand-in for a provider: answers `ANSWER-<route>-<n>` unless a fault fires."""

    def __init__(self, provider: FixtureProvider) -> None:
        self.provider = provider

    def call(self, request: AdapterRequest) -> AdapterResult:
        fault = self.provider.take_fault(ADAPTER_FAULTS, request.route_id, request.tenant,
                                         request.idempotency_key)
        number = self.provider.record_call({
            "operation_id": request.operation_id, "tenant": request.tenant,
            "idempotency_key": request.idempotency_key, "route_id": request.route_id,
            "adapter_kind": request.adapter_kind, "pool": request.pool,
            "profile_id": request.profile_id, "model_id": request.model_id,
            "network_policy": request.network_policy,
            "provider_idempotency_key": request.provider_idempotency_key,
            "max_output_tokens": request.max_output_tokens, "fault": fault,
            "input_sha256": hashlib.sha256(request.input_text.encode("utf-8")).hexdigest()})
        if fault == "refuse_before_send":
            raise RefusedBeforeSend("the fixture refused the request before sending it")
        behaviour = self.provider.behaviour()
        if behaviour.latency_seconds > 0:
            time.sleep(behaviour.latency_seconds)
        if fault == "timeout_after_send":
            raise OutcomeUnknown("the fixture timed out after sending the request")
        if fault == "crash_after_send":
            os._exit(137)  # the worker dies mid-call, as under SIGKILL
        output_tokens = min(request.max_output_tokens,
                            max(0, round(request.max_output_tokens * behaviour.output_share)))
        return AdapterResult(text=f"ANSWER-{request.route_id}-{number}",
                             input_tokens=request.input_tokens, output_tokens=output_tokens,
                             provider_request_id=self.request_id(request, number))

    def request_id(self, request: AdapterRequest, number: int) -> str:
        return f"{request.provider}-{number}"


class FixtureHostedAdapter(FixtureAdapter):
    """A hosted provider reached over its API."""


class FixtureSelfHostedAdapter(FixtureAdapter):
    """A self-hosted replica in a fleet pool; its request ids name the pool."""

    def request_id(self, request: AdapterRequest, number: int) -> str:
        return f"{request.pool}-{number}"


def adapter_for(adapter_kind: str, provider: FixtureProvider | None = None) -> Adapter:
    """The approved adapter for a route's kind; only fixture adapters exist so far."""
    provider = provider or fixture_provider()
    if adapter_kind == "self_hosted":
        return FixtureSelfHostedAdapter(provider)
    if adapter_kind == "hosted":
        return FixtureHostedAdapter(provider)
    raise ValueError(f"no adapter for route kind {adapter_kind!r}")
