"""The gateway spec's common fixture (§10) as commands, and a driver that runs requests through
the queue and the log and reads back what happened: responses, operations, budgets, calls."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from controlplane.commands.base import CommandBase
from controlplane.commands.gateway import (
    ConfigureBudget,
    ConfigureRoute,
    CreateReleaseBundle,
    Dispatch,
    MoveReleasePointer,
    RegisterPrincipal,
    RegisterProfile,
    RegisterSource,
    RegisterTenant,
    RevokePrincipal,
)
from controlplane.commands.gateway_specs import GpuPlanSpec, SourceRefSpec
from controlplane.commands.memory import ModelMemorySpec
from controlplane.gateway.fixture_provider import FixtureProvider
from controlplane.gateway.responses import response_for
from controlplane.settings import Settings
from controlplane.state import gateway as gw
from events.projections import SqlProjections
from events.store import EventStore

TENANT_OF = {"alice": "acme", "bob": "acme", "mallory": "acme", "carol": "beta"}
MEMORY_8B = ModelMemorySpec(parameters=8_000_000_000, weight_bits=16, layers=32, kv_heads=8,
                            head_dim=128)
MEMORY_70B = ModelMemorySpec(parameters=70_000_000_000, weight_bits=16, layers=80, kv_heads=8,
                             head_dim=128)
SH1_PLAN = GpuPlanSpec(gpu_memory_gib=80.0, usable_fraction=0.9, tensor_parallel_size=1,
                       max_concurrent_sequences=8)


def words(count: int, word: str = "w") -> str:
    """An input of exactly `count` tokens under the whitespace counting rule."""
    return " ".join(f"{word}{i}" for i in range(count))


def route(route_id: str, **changes: Any) -> ConfigureRoute:
    """One of the fixture's routes, with `changes` applied (e.g. `ready=False`)."""
    base: dict[str, dict[str, Any]] = {
        "sh-1": {"adapter_kind": "self_hosted", "provider": "selfhost", "private": True,
                 "compatible_profiles": ["chat-small-v1", "chat-large-v2", "chat-70b"],
                 "pool": "pool-a", "gpu_plan": SH1_PLAN},
        "hc-1": {"adapter_kind": "hosted", "provider": "hostedco", "private": False,
                 "compatible_profiles": ["chat-small-v1", "chat-large-v2"]},
        "hx-1": {"adapter_kind": "hosted", "provider": "unvetted", "private": False,
                 "compatible_profiles": ["chat-small-v1"]},
    }
    fields = {"approved": True, "ready": True, **base[route_id], **changes}
    return ConfigureRoute(command_id=f"route-{route_id}-{uuid.uuid4().hex[:10]}", route_id=route_id,
                          **fields)


def common_fixture(budget_limit_units: int = 10_000) -> list[CommandBase]:
    """Tenants acme (private only) and beta (hosted allowed) sharing budget shared-1, and the rest."""
    providers = ["hostedco", "selfhost"]
    shared_readers = ["alice", "bob", "carol"]
    commands: list[CommandBase] = [
        ConfigureBudget(budget_id="shared-1", limit_units=budget_limit_units),
        RegisterTenant(tenant="acme", network_policy="private_only", budget_id="shared-1"),
        RegisterTenant(tenant="beta", network_policy="hosted_allowed", budget_id="shared-1"),
        *[RegisterPrincipal(tenant=TENANT_OF[p], principal_id=p)
          for p in ("alice", "bob", "carol", "mallory")],
        RevokePrincipal(tenant="acme", principal_id="mallory"),
        RegisterSource(tenant="acme", source_ref="doc-a", version=3, readers=shared_readers),
        RegisterSource(tenant="acme", source_ref="doc-b", version=1, readers=shared_readers),
        RegisterSource(tenant="acme", source_ref="doc-c", version=2),
        RegisterProfile(profile_id="chat-small-v1", model_id="small-8b", digest="sha256:small",
                        approved=True, context_window_tokens=8_192, max_output_tokens=1_024,
                        capabilities=["text"], approved_providers=providers, memory=MEMORY_8B),
        RegisterProfile(profile_id="chat-large-v2", model_id="large-8b-32k", digest="sha256:large",
                        approved=True, context_window_tokens=32_768, max_output_tokens=2_048,
                        capabilities=["text", "tools"], approved_providers=providers,
                        memory=MEMORY_8B),
        RegisterProfile(profile_id="chat-70b", model_id="dense-70b", digest="sha256:70b",
                        approved=True, context_window_tokens=8_192, max_output_tokens=1_024,
                        capabilities=["text"], approved_providers=providers, memory=MEMORY_70B),
        route("sh-1"), route("hc-1"), route("hx-1"),
        CreateReleaseBundle(release_id="rel-1", profile_id="chat-small-v1", gate_status="approved",
                            source_refs=[SourceRefSpec(source_ref="doc-a", version=3),
                                         SourceRefSpec(source_ref="doc-b", version=1)]),
        CreateReleaseBundle(release_id="rel-2", profile_id="chat-large-v2", gate_status="approved",
                            source_refs=[SourceRefSpec(source_ref="doc-c", version=2)]),
        CreateReleaseBundle(release_id="rel-bad", profile_id="chat-rogue", gate_status="approved"),
        CreateReleaseBundle(release_id="rel-70b", profile_id="chat-70b", gate_status="approved"),
        MoveReleasePointer(tenant="acme", pointer_name="acme/assistant", release_id="rel-1"),
        MoveReleasePointer(tenant="beta", pointer_name="beta/assistant", release_id="rel-1"),
    ]
    return commands


def dispatch(principal: str, key: str, *, tenant: str | None = None, input_words: int = 100,
             text: str | None = None, max_output_tokens: int | None = 256,
             pointer_name: str | None = None, **fields: Any) -> Dispatch:
    """A `Dispatch` by `principal` under `key`; the pointer defaults to its tenant's assistant."""
    tenant = tenant or TENANT_OF.get(principal, "acme")
    return Dispatch(command_id=f"d-{key}-{uuid.uuid4().hex[:12]}", tenant=tenant,
                    principal_id=principal, idempotency_key=key,
                    pointer_name=pointer_name or f"{tenant}/assistant",
                    input=text if text is not None else words(input_words),
                    max_output_tokens=max_output_tokens, **fields)


class GatewayDriver:
    """Runs commands through `submit` (accept, enqueue, work) and reads what they left behind."""

    def __init__(self, settings: Settings, store: EventStore, provider: FixtureProvider) -> None:
        self.settings, self.store, self.provider = settings, store, provider

    def run(self, *commands: CommandBase) -> None:
        from workers.pipeline import submit  # the queue path; imported late to keep layers apart

        submit(self.settings, self.store, list(commands))

    def send(self, command: Dispatch) -> dict[str, Any]:
        """Submit one request and return the caller's response."""
        self.run(command)
        return response_for(self.store, command.command_id)

    def projection(self, name: str, key: str) -> dict[str, Any] | None:
        with self.store.engine.connect() as conn:
            return SqlProjections(conn).get(name, key)

    def operation(self, tenant: str, key: str) -> dict[str, Any] | None:
        return self.projection(gw.OPERATIONS, gw.operation_key(tenant, key))

    def budget(self, budget_id: str = "shared-1") -> dict[str, Any]:
        return self.projection(gw.BUDGETS, budget_id) or {}

    def calls(self, route_id: str | None = None, tenant: str | None = None,
              key: str | None = None) -> int:
        return len(self.provider.calls(route_id, tenant, key))

    def stream_types(self, tenant: str, key: str) -> list[str]:
        return [e.event_type for e in self.store.read_stream(gw.operation_stream(tenant, key))]

    def denials(self, tenant: str, key: str) -> list[tuple[str, str]]:
        """(step, code) of every denial audited under the key."""
        return [(e.data["result"]["step"], e.data["result"]["code"])
                for e in self.store.read_stream(gw.operation_stream(tenant, key))
                if e.event_type == gw.DISPATCH_DENIED]


def command_ids(commands: Sequence[CommandBase]) -> list[str]:
    return [c.command_id for c in commands]
