"""Select: the release pointer, the trusted profile registry, then one approved, compatible, policy-
respecting, ready route (spec §5.1 step 4).

The filters run in a fixed order and the denial names the first filter that left no route, so a
route that is not ready is never replaced by a hosted route the tenant's policy forbids. The choice
among survivors is deterministic: private before hosted, then the lowest route id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controlplane.policies.gateway import (
    AdapterKind,
    GateStatus,
    NetworkPolicy,
    NetworkPreference,
    Profile,
    ReleaseBundle,
    ReleasePointer,
    Route,
    Step,
    StepVerdict,
    allow,
    deny,
)
from controlplane.policies.memory import (
    DeploymentMemory,
    assess_memory,
    kv_shards_under_tensor_parallel,
)
from controlplane.policies.reasons import Reason


@dataclass(frozen=True)
class RouteRuling:
    """Why one route was or was not eligible: `ruled_out_by` is the first filter it failed."""

    route_id: str
    ruled_out_by: str | None


@dataclass(frozen=True)
class Selection:
    verdict: StepVerdict
    profile: Profile | None
    route: Route | None
    rulings: tuple[RouteRuling, ...] = ()


def resolve_release(tenant_id: str, pointer_name: str, pointer: ReleasePointer | None,
                    bundle: ReleaseBundle | None) -> StepVerdict:
    """Allow a pointer of the caller's tenant that names a gate-approved bundle."""
    facts = {"pointer_name": pointer_name}
    if pointer is None or pointer.tenant_id != tenant_id or bundle is None:
        return deny(Step.SELECT, [Reason("release_pointer_missing", "no such release pointer", facts)])
    if bundle.gate_status is not GateStatus.APPROVED:
        return deny(Step.SELECT, [Reason("release_not_approved", "the release has not passed the gate",
                                         {**facts, "release_id": bundle.release_id,
                                          "gate_status": bundle.gate_status.value})])
    return allow(Step.SELECT, "release_resolved", "the pointer names an approved release",
                 **facts, release_id=bundle.release_id, pointer_version=pointer.version)


def effective_network_policy(tenant_policy: NetworkPolicy,
                             preference: NetworkPreference | None) -> NetworkPolicy:
    """The stricter of the tenant's policy and the caller's preference."""
    if preference is NetworkPreference.PRIVATE:
        return NetworkPolicy.PRIVATE_ONLY
    return tenant_policy


def stricter_policy(first: NetworkPolicy, second: NetworkPolicy) -> NetworkPolicy:
    """The stricter of two network policies: `private_only` if either is."""
    return NetworkPolicy.PRIVATE_ONLY if NetworkPolicy.PRIVATE_ONLY in (first, second) else first


def reserved_route_verdict(bundle: ReleaseBundle | None, profiles: Mapping[str, Profile],
                           route: Route | None, reserved_policy: NetworkPolicy,
                           tenant_policy: NetworkPolicy) -> StepVerdict:
    """Allow only while the route pinned at reservation would still pass Select for the pinned
    release's profile, under the stricter of the reserved policy and the tenant's current one.

    Nothing is re-chosen: a route that no longer passes is a denial, never a fallback (spec §5.1
    step 4 hard rule); a tenant that loosened its policy since does not loosen the request's.
    """
    policy = stricter_policy(reserved_policy, tenant_policy)
    facts: dict[str, object] = {"route_id": None, "profile_id": None,
                                "network_policy": policy.value, "select_code": "route_unknown"}
    if bundle is not None and route is not None:
        facts.update(route_id=route.route_id, profile_id=bundle.profile_id,
                     approved=route.approved, ready=route.ready, private=route.private)
        verdict = select_route(bundle, profiles, (route,), policy).verdict
        facts["select_code"] = verdict.code
        if verdict.allowed:
            return allow(Step.SELECT, "reserved_route_eligible", "the reserved route may still "
                         "serve the request", **facts)
    return deny(Step.SELECT, [Reason(
        "route_withdrawn", "the route chosen at reservation may no longer serve the request: it "
        "is not approved, trusted, compatible or ready, or outside the tenant's network policy",
        facts)])


def memory_fits(profile: Profile, route: Route) -> dict[str, object] | None:
    """None when the route is shown to hold the profile: a hosted route (memory is its
    provider's), or a self-hosted one whose GPU plan holds its concurrency at the profile's
    context window (spec §5.1 step 4, §9). Otherwise the facts: the shortfall, or what is
    `missing` to show the fit at all (the route's `gpu_plan`, the profile's `memory`), since a
    fit nobody can check is not a fit."""
    if route.adapter_kind is not AdapterKind.SELF_HOSTED:
        return None
    if route.gpu_plan is None or profile.memory is None:
        missing = [name for name, value in (("gpu_plan", route.gpu_plan),
                                            ("memory", profile.memory)) if value is None]
        return {"route_id": route.route_id, "profile_id": profile.profile_id, "missing": missing}
    plan, model = route.gpu_plan, profile.memory
    deployment = DeploymentMemory(
        gpu_memory_gib=plan.gpu_memory_gib, tensor_parallel_size=plan.tensor_parallel_size,
        kv_shards=kv_shards_under_tensor_parallel(model.kv_heads, plan.tensor_parallel_size,
                                                  model.kv_latent_dim > 0),
        max_live_tokens_per_request=profile.context_window_tokens,
        target_concurrency=plan.max_concurrent_sequences,
        runtime_overhead_gib=plan.runtime_overhead_gib, usable_fraction=plan.usable_fraction)
    assessment = assess_memory(model, deployment)
    if assessment.fits:
        return None
    return {"route_id": route.route_id, "required_gib_per_gpu": assessment.required_gib_per_gpu,
            "usable_gib_per_gpu": assessment.usable_gib_per_gpu,
            "max_concurrency": assessment.max_concurrency}


def _first_failure(route: Route, profile: Profile, policy: NetworkPolicy) -> str | None:
    if profile.profile_id not in route.compatible_profiles:
        return "profile_not_compatible"
    if not route.approved or route.provider not in profile.approved_providers:
        return "provider_not_approved"
    if policy is NetworkPolicy.PRIVATE_ONLY and not route.private:
        return "private_route_required"
    if not route.ready:
        return "route_not_ready"
    misfit = memory_fits(profile, route)
    if misfit is not None:
        return "memory_fit_unproven" if "missing" in misfit else "memory_does_not_fit"
    return None


# Which denial each filter produces when it removes the last candidate, in filter order.
_DENIALS = (("profile_not_compatible", "no_compatible_route"),
            ("provider_not_approved", "provider_not_approved"),
            ("private_route_required", "private_route_required"),
            ("route_not_ready", "route_not_ready"),
            ("memory_fit_unproven", "no_compatible_route"),
            ("memory_does_not_fit", "no_compatible_route"))


def select_route(bundle: ReleaseBundle, profiles: Mapping[str, Profile], routes: Sequence[Route],
                 policy: NetworkPolicy) -> Selection:
    """Choose the route for `bundle`'s profile under `policy`, or deny with the filter that emptied it."""
    profile = profiles.get(bundle.profile_id)
    facts: dict[str, object] = {"profile_id": bundle.profile_id, "release_id": bundle.release_id}
    if profile is None:
        return Selection(deny(Step.SELECT, [Reason("profile_unknown",
                                                   "the profile is not in the trusted registry",
                                                   facts)]), None, None)
    if not profile.approved or (bundle.profile_digest is not None
                                and bundle.profile_digest != profile.digest):
        return Selection(deny(Step.SELECT, [Reason(
            "profile_untrusted", "the profile is not approved or its digest does not match",
            {**facts, "approved": profile.approved, "expected_digest": bundle.profile_digest,
             "registered_digest": profile.digest})]), profile, None)
    ordered = sorted(routes, key=lambda r: r.route_id)
    rulings = tuple(RouteRuling(r.route_id, _first_failure(r, profile, policy)) for r in ordered)
    eligible = [r for r, ruling in zip(ordered, rulings, strict=True) if ruling.ruled_out_by is None]
    facts.update(network_policy=policy.value,
                 rulings={r.route_id: r.ruled_out_by or "eligible" for r in rulings})
    if not eligible:
        failures = {ruling.ruled_out_by for ruling in rulings}
        # The denial is the last filter any route reached: the one that removed the last candidate.
        code = "no_compatible_route"
        for failure, denial in _DENIALS:
            if any(_passes_before(failure, f) for f in failures):
                code = denial
        misfits = [misfit for misfit in (memory_fits(profile, r) for r in ordered) if misfit]
        if misfits:
            facts["memory"] = misfits
        return Selection(deny(Step.SELECT, [Reason(code, "no route satisfies the release's profile "
                                                   "under the tenant's policy", facts)]),
                         profile, None, rulings)
    chosen = min(eligible, key=lambda r: (not r.private, r.route_id))
    verdict = allow(Step.SELECT, "route_selected", "an approved, compatible, ready route was chosen",
                    **facts, route_id=chosen.route_id, adapter_kind=chosen.adapter_kind.value)
    return Selection(verdict, profile, chosen, rulings)


def _passes_before(filter_name: str, failure: str | None) -> bool:
    """True when a route that failed at `failure` got at least as far as `filter_name`."""
    order = [name for name, _ in _DENIALS]
    return failure is not None and order.index(failure) >= order.index(filter_name)

