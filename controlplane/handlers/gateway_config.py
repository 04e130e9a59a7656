"""Gateway registry handlers: tenants, principals, evidence sources, profiles, routes, releases,
the release pointer and budgets.

Each decision records the whole new record, so the projection copies it and explain shows it.
A tenant may only change what it owns. Profiles, routes and release bundles (with their gate
verdicts) serve every tenant, so only the operator (the default tenant) changes them, checked at
submit and again at decision. A release bundle never changes; a pointer move with an
`expected_version` is compare-and-set. A budget is changed only by the tenant that created it, and a
tenant attaches to another tenant's budget only when that owner listed it in `shared_with` (the
operator's budgets are open to every tenant); both are checked at submit and again at decision.
"""

from __future__ import annotations

from typing import Any

from controlplane.commands.base import CommandBase
from controlplane.commands.gateway import (
    OPERATOR_TENANT,
    ConfigureBudget,
    ConfigureRoute,
    CreateReleaseBundle,
    MoveReleasePointer,
    RegisterPrincipal,
    RegisterProfile,
    RegisterSource,
    RegisterTenant,
    RestorePrincipal,
    RestoreSource,
    RevokePrincipal,
    RevokeSource,
    SetNetworkPolicy,
)
from controlplane.decisions import DecisionContext, append_to, decision_data, new_event, rejection
from controlplane.gateway.world import budget_access_of, budget_of, tenants_drawing_on
from controlplane.handlers.base import Handler, Precheck
from controlplane.policies.gateway_budget import reconfigure
from controlplane.policies.reasons import PolicyInputError, Reason, to_plain
from controlplane.state import gateway as gw
from events.model import StreamAppend
from events.projections import StateView


def _record(command: CommandBase, ctx: DecisionContext, kind: str, key: str, event_type: str,
            record: dict[str, Any], code: str, message: str) -> list[StreamAppend]:
    # The outcome is the code's verb: "registered", "revoked", "moved"...
    data = decision_data(outcome=code.rsplit("_", 1)[-1],
                         reasons=[Reason(code, message, {"kind": kind, "key": key})],
                         result={"kind": kind, "key": key, "record": record}, policy=None,
                         inputs=command.payload(), ctx=ctx)
    return [append_to(f"{kind}/{key}", ctx, new_event(command, ctx, "decision", event_type, data))]


def _owned(state: StateView, kind: str, key: str) -> dict[str, Any] | None:
    row = state.get(gw.REGISTRIES[kind], key)
    return {k: v for k, v in row.items() if k != "event_id"} if row is not None else None


def _refuse(command: CommandBase, ctx: DecisionContext, code: str, field: str, message: str,
            stream: str) -> list[StreamAppend]:
    return rejection(command, ctx, PolicyInputError(code, field, message), stream)


def _operator_problem(command: CommandBase, kind: str) -> PolicyInputError | None:
    """Why `command` may not change the shared `kind` registry; None when the operator sends it."""
    if command.tenant == OPERATOR_TENANT:
        return None
    return PolicyInputError("operator_only", "tenant",
                            f"only the operator (tenant {OPERATOR_TENANT!r}) may change a {kind}; "
                            "every tenant's requests are served under it")


def _budget_problem(command: CommandBase, state: StateView) -> PolicyInputError | None:
    """Why `command` may not change, or attach its tenant to, the budget it names; None if it may."""
    if isinstance(command, ConfigureBudget):
        access = budget_access_of(state, command.budget_id)
        if access is None:
            return None
        if not access.may_change(command.tenant):
            return PolicyInputError("budget_tenant_mismatch", "budget_id",
                                    f"budget {command.budget_id!r} belongs to another tenant")
        locked_out = access.unshared(tenants_drawing_on(state, command.budget_id),
                                     frozenset(command.shared_with))
        if locked_out:
            return PolicyInputError("budget_share_in_use", "shared_with",
                                    f"tenants {locked_out} draw on budget {command.budget_id!r}; "
                                    "attach them to another budget first")
    elif isinstance(command, RegisterTenant):
        access = budget_access_of(state, command.budget_id)
        if access is not None and not access.may_attach(command.tenant):
            return PolicyInputError("budget_not_shared", "budget_id",
                                    f"budget {command.budget_id!r} belongs to another tenant "
                                    "that has not shared it with this one")
    return None


def _precheck_budget(command: CommandBase, state: StateView) -> list[tuple[str, str]]:
    problem = _budget_problem(command, state)
    return [(problem.field, problem.message)] if problem is not None else []


def handle_register_tenant(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    assert isinstance(command, RegisterTenant)
    stream = f"tenant/{command.tenant}"
    if budget_access_of(ctx.state, command.budget_id) is None:
        return _refuse(command, ctx, "budget_not_configured", "budget_id", "no such budget", stream)
    problem = _budget_problem(command, ctx.state)
    if problem is not None:
        return rejection(command, ctx, problem, stream)
    allowed = sorted(command.allowed_capabilities) if command.allowed_capabilities is not None else None
    record = {"tenant_id": command.tenant, "network_policy": command.network_policy,
              "budget_id": command.budget_id, "allowed_capabilities": allowed}
    return _record(command, ctx, "tenant", command.tenant, gw.TENANT_REGISTERED, record,
                   "tenant_registered", "tenant registered")


def handle_set_network_policy(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    assert isinstance(command, SetNetworkPolicy)
    existing = _owned(ctx.state, "tenant", command.tenant)
    if existing is None:  # its registration was refused: there is no budget to keep
        return _refuse(command, ctx, "tenant_not_registered", "tenant",
                       "no such tenant; register it first", f"tenant/{command.tenant}")
    record = {**existing, "network_policy": command.network_policy}
    return _record(command, ctx, "tenant", command.tenant, gw.NETWORK_POLICY_SET, record,
                   "network_policy_set", "tenant network policy set")


def handle_register_principal(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Register a principal, active; registering a revoked one again keeps it revoked (only
    `RestorePrincipal` undoes a revocation, as only `RestoreSource` undoes a source's)."""
    assert isinstance(command, RegisterPrincipal)
    existing = _owned(ctx.state, "principal", command.principal_id)
    if existing is not None and existing["tenant_id"] != command.tenant:
        return _refuse(command, ctx, "principal_tenant_conflict", "principal_id",
                       "the principal belongs to another tenant", f"principal/{command.principal_id}")
    active = existing["active"] if existing is not None else True
    record = {"principal_id": command.principal_id, "tenant_id": command.tenant, "active": active}
    return _record(command, ctx, "principal", command.principal_id, gw.PRINCIPAL_REGISTERED, record,
                   "principal_registered", "principal registered and active" if active else
                   "principal registered; it stays revoked until RestorePrincipal")


def _status_handler(command_type: type[RevokePrincipal | RestorePrincipal | RevokeSource
                                       | RestoreSource], kind: str, key_field: str,
                    active: bool, event_type: str) -> Handler:
    """The handler that revokes (`active` False) or restores a principal or a source of the
    command's own tenant, recording `<kind>_revoked` or `<kind>_restored`."""
    code = f"{kind}_{'restored' if active else 'revoked'}"

    def handle(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
        assert isinstance(command, command_type)
        key = getattr(command, key_field)
        existing = _owned(ctx.state, kind, key)
        if existing is None or existing["tenant_id"] != command.tenant:
            return _refuse(command, ctx, f"{kind}_tenant_mismatch", key_field,
                           f"no such {kind} in this tenant", f"{kind}/{key}")
        return _record(command, ctx, kind, key, event_type, {**existing, "active": active},
                       code, code.replace("_", " "))

    return handle


def handle_register_source(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    assert isinstance(command, RegisterSource)
    stream = f"source/{command.source_ref}"
    existing = _owned(ctx.state, "source", command.source_ref)
    if existing is not None and existing["tenant_id"] != command.tenant:
        return _refuse(command, ctx, "source_tenant_conflict", "source_ref",
                       "the source belongs to another tenant", stream)
    if existing is not None and command.version < existing["current_version"]:
        return _refuse(command, ctx, "source_version_regressed", "version",
                       "a source version never goes backwards", stream)
    record = {"source_ref": command.source_ref, "tenant_id": command.tenant,
              "current_version": command.version,
              "active": existing["active"] if existing is not None else True,
              "readers": sorted(set(command.readers))}
    return _record(command, ctx, "source", command.source_ref, gw.SOURCE_REGISTERED, record,
                   "source_registered", "evidence source version registered")


_PROFILE_RECORD = frozenset({"profile_id", "model_id", "digest", "approved",
                             "context_window_tokens", "max_output_tokens", "input_limit_tokens",
                             "memory", "token_counting"})


def handle_register_profile(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    assert isinstance(command, RegisterProfile)
    problem = _operator_problem(command, "profile")
    if problem is not None:
        return rejection(command, ctx, problem, f"profile/{command.profile_id}")
    # From the payload, which leaves `token_counting` out at its default: a profile recorded
    # before the rule existed is recorded as it was.
    record = {key: value for key, value in command.payload().items() if key in _PROFILE_RECORD}
    record.update(capabilities=sorted(command.capabilities),
                  approved_providers=sorted(command.approved_providers))
    return _record(command, ctx, "profile", command.profile_id, gw.PROFILE_REGISTERED, record,
                   "profile_registered", "profile registered in the trusted registry")


def _route_problem(command: ConfigureRoute) -> PolicyInputError | None:
    """Why the route cannot be configured as sent; None when it can. A self-hosted route must
    carry the GPU plan Select proves the profile's memory fit against (spec §3.1, §5.1 step 4):
    without one no fit can be shown, so it could never serve."""
    if command.adapter_kind == "self_hosted" and command.gpu_plan is None:
        return PolicyInputError("gpu_plan_required", "gpu_plan",
                                "a self_hosted route needs the gpu_plan its memory fit is "
                                "checked against")
    return None


def handle_configure_route(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    assert isinstance(command, ConfigureRoute)
    problem = _operator_problem(command, "route") or _route_problem(command)
    if problem is not None:
        return rejection(command, ctx, problem, f"route/{command.route_id}")
    record = command.model_dump(mode="json", include={
        "route_id", "adapter_kind", "provider", "private", "approved", "ready", "pool", "gpu_plan",
        "prices", "economics"})
    record["compatible_profiles"] = sorted(set(command.compatible_profiles))
    return _record(command, ctx, "route", command.route_id, gw.ROUTE_CONFIGURED, record,
                   "route_configured", "route configured")


def handle_create_release_bundle(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    assert isinstance(command, CreateReleaseBundle)
    problem = _operator_problem(command, "release bundle")
    if problem is not None:
        return rejection(command, ctx, problem, f"release/{command.release_id}")
    if ctx.state.get(gw.REGISTRIES["release"], command.release_id) is not None:
        return _refuse(command, ctx, "release_bundle_immutable", "release_id",
                       "a release bundle is never changed; create a new one",
                       f"release/{command.release_id}")
    record = command.model_dump(mode="json", include={
        "release_id", "profile_id", "profile_digest", "source_refs", "gate_status"})
    return _record(command, ctx, "release", command.release_id, gw.RELEASE_BUNDLE_CREATED, record,
                   "release_bundle_created", "immutable release bundle created")


def handle_move_release_pointer(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    assert isinstance(command, MoveReleasePointer)
    stream = f"release-pointer/{command.pointer_name}"
    existing = _owned(ctx.state, "release-pointer", command.pointer_name)
    if existing is not None and existing["tenant_id"] != command.tenant:
        return _refuse(command, ctx, "pointer_tenant_mismatch", "pointer_name",
                       "the pointer belongs to another tenant", stream)
    version = existing["version"] if existing is not None else 0
    if command.expected_version is not None and command.expected_version != version:
        return _refuse(command, ctx, "pointer_version_conflict", "expected_version",
                       f"the pointer is at version {version}", stream)
    record = {"pointer_name": command.pointer_name, "tenant_id": command.tenant,
              "release_id": command.release_id, "version": version + 1,
              "previous_release_id": existing["release_id"] if existing is not None else None}
    return _record(command, ctx, "release-pointer", command.pointer_name, gw.RELEASE_POINTER_MOVED,
                   record, "release_pointer_moved", "release pointer moved")


def handle_configure_budget(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    assert isinstance(command, ConfigureBudget)
    problem = _budget_problem(command, ctx.state)
    if problem is not None:
        return rejection(command, ctx, problem, gw.budget_stream(command.budget_id))
    before = budget_of(ctx.state, command.budget_id)
    after = reconfigure(before, command.budget_id, command.limit_units)
    existing = budget_access_of(ctx.state, command.budget_id)
    owner = existing.owner_tenant if existing is not None else command.tenant
    access = {"owner_tenant": owner, "shared_with": sorted(command.shared_with),
              "open_to_every_tenant": owner == OPERATOR_TENANT}
    reason = Reason("budget_configured", "budget limit set; reservations are kept",
                    {"limit_units": command.limit_units, **access})
    data = decision_data(outcome="configured", reasons=[reason],
                         result={"budget_id": command.budget_id, "before": to_plain(before),
                                 "after": to_plain(after), "access": access},
                         policy=None, inputs=command.payload(), ctx=ctx)
    return [append_to(gw.budget_stream(command.budget_id), ctx,
                      new_event(command, ctx, "decision", gw.BUDGET_CONFIGURED, data))]


def _precheck_owner(kind: str, field: str) -> Precheck:
    def check(command: CommandBase, state: StateView) -> list[tuple[str, str]]:
        key = str(getattr(command, field))
        row = state.get(gw.REGISTRIES[kind], key)
        if row is not None and row["tenant_id"] != command.tenant:
            return [(field, f"{kind} {key!r} belongs to another tenant")]
        return []
    return check


def _precheck_operator(kind: str) -> Precheck:
    def check(command: CommandBase, state: StateView) -> list[tuple[str, str]]:
        problem = _operator_problem(command, kind)
        return [(problem.field, problem.message)] if problem is not None else []
    return check


def _precheck_route(command: CommandBase, state: StateView) -> list[tuple[str, str]]:
    """The operator's, and a self-hosted route's GPU plan: refused at submit, nothing written."""
    assert isinstance(command, ConfigureRoute)
    problems = [_operator_problem(command, "route"), _route_problem(command)]
    return [(problem.field, problem.message) for problem in problems if problem is not None]


HANDLERS: dict[str, Handler] = {
    "RegisterTenant": handle_register_tenant,
    "SetNetworkPolicy": handle_set_network_policy,
    "RegisterPrincipal": handle_register_principal,
    "RevokePrincipal": _status_handler(RevokePrincipal, "principal", "principal_id", False,
                                       gw.PRINCIPAL_REVOKED),
    "RestorePrincipal": _status_handler(RestorePrincipal, "principal", "principal_id", True,
                                        gw.PRINCIPAL_RESTORED),
    "RegisterSource": handle_register_source,
    "RevokeSource": _status_handler(RevokeSource, "source", "source_ref", False,
                                    gw.SOURCE_REVOKED),
    "RestoreSource": _status_handler(RestoreSource, "source", "source_ref", True,
                                     gw.SOURCE_RESTORED),
    "RegisterProfile": handle_register_profile,
    "ConfigureRoute": handle_configure_route,
    "CreateReleaseBundle": handle_create_release_bundle,
    "MoveReleasePointer": handle_move_release_pointer,
    "ConfigureBudget": handle_configure_budget,
}
PRECHECKS: dict[str, Precheck] = {
    "RegisterTenant": _precheck_budget,
    "ConfigureBudget": _precheck_budget,
    "RegisterPrincipal": _precheck_owner("principal", "principal_id"),
    "RevokePrincipal": _precheck_owner("principal", "principal_id"),
    "RestorePrincipal": _precheck_owner("principal", "principal_id"),
    "RegisterSource": _precheck_owner("source", "source_ref"),
    "RevokeSource": _precheck_owner("source", "source_ref"),
    "RestoreSource": _precheck_owner("source", "source_ref"),
    "MoveReleasePointer": _precheck_owner("release-pointer", "pointer_name"),
    "RegisterProfile": _precheck_operator("profile"),
    "ConfigureRoute": _precheck_route,
    "CreateReleaseBundle": _precheck_operator("release bundle"),
}
# Versions of the decision rules, each with what changed (see `handlers/base.py`).
RULES_VERSIONS: dict[str, int] = {
    # 2: a self-hosted route without a GPU plan is rejected (`gpu_plan_required`): its memory
    #    fit could never be shown. Refused at submit too.
    "ConfigureRoute": 2,
    # 2: registering a revoked principal again keeps it revoked (it had made it active).
    "RegisterPrincipal": 2,
}
