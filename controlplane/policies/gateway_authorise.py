"""Authorise: the caller's identity, then the original and current status of its evidence (spec §5.1, §7).

Identity is checked before anything else, so a revoked or unknown caller learns nothing about
keys or answers. Evidence is checked against its *current* status on every request and replay:
one revoked source withholds the whole answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controlplane.policies.gateway import (
    Principal,
    Source,
    SourceRef,
    Step,
    StepVerdict,
    Tenant,
    allow,
    deny,
)
from controlplane.policies.reasons import Reason


def authorise_identity(claimed_tenant_id: str, principal_id: str, principal: Principal | None,
                       tenant: Tenant | None) -> StepVerdict:
    """Allow only a known, active principal of the claimed (registered) tenant."""
    facts = {"principal_id": principal_id, "claimed_tenant_id": claimed_tenant_id}
    if principal is None:
        return deny(Step.AUTHORISE, [Reason("identity_unknown", "caller identity is not recognised",
                                            facts)])
    if not principal.active:
        return deny(Step.AUTHORISE, [Reason("identity_revoked", "caller identity has been revoked",
                                            facts)])
    if principal.tenant_id != claimed_tenant_id:
        return deny(Step.AUTHORISE, [Reason(
            "tenant_mismatch", "caller does not belong to the requested tenant",
            {**facts, "principal_tenant_id": principal.tenant_id})])
    if tenant is None:
        return deny(Step.AUTHORISE, [Reason("tenant_unknown", "the tenant is not registered", facts)])
    return allow(Step.AUTHORISE, "identity_authorised", "caller identity is active", **facts)


def evidence_set(bundle_refs: Sequence[SourceRef], caller_refs: Sequence[SourceRef]) \
        -> tuple[SourceRef, ...]:
    """The bundle's refs then the caller's, without duplicates, in that order."""
    seen: dict[tuple[str, int], SourceRef] = {}
    for ref in (*bundle_refs, *caller_refs):
        seen.setdefault((ref.source_ref, ref.version), ref)
    return tuple(seen.values())


def authorise_evidence(principal: Principal, refs: Sequence[SourceRef],
                       sources: Mapping[str, Source],
                       caller_refs: Sequence[SourceRef] = ()) -> StepVerdict:
    """Allow only when every ref is readable and currently active; caller refs must be current.

    Failing gates are reported in a fixed order: forbidden, revoked, stale, each listing every
    offending ref (an unknown ref counts as forbidden, so existence is not leaked).
    """
    forbidden: list[str] = []
    revoked: list[str] = []
    for ref in refs:
        source = sources.get(ref.source_ref)
        if source is None or not source.readable_by(principal):
            forbidden.append(ref.source_ref)
        elif not source.active:
            revoked.append(ref.source_ref)
    stale = [{"source_ref": ref.source_ref, "version": ref.version,
              "current_version": sources[ref.source_ref].current_version}
             for ref in caller_refs
             if ref.source_ref in sources and ref.source_ref not in forbidden
             and sources[ref.source_ref].current_version != ref.version]
    reasons = []
    if forbidden:
        reasons.append(Reason("source_forbidden", "caller may not read some evidence sources",
                              {"source_refs": sorted(set(forbidden))}))
    if revoked:
        reasons.append(Reason("source_revoked", "evidence sources have been revoked",
                              {"source_refs": sorted(set(revoked))}))
    if stale:
        reasons.append(Reason("source_stale", "a requested source version is no longer current",
                              {"stale": sorted(stale, key=lambda item: str(item["source_ref"]))}))
    if reasons:
        return deny(Step.AUTHORISE, reasons)
    return allow(Step.AUTHORISE, "evidence_authorised", "every evidence source is readable and active",
                 source_refs=[{"source_ref": r.source_ref, "version": r.version} for r in refs])
