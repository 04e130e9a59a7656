"""Gateway authorise step: identity first, then original and current evidence (spec §5.1, §7)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.gateway import NetworkPolicy, Principal, Source, SourceRef, Step, Tenant
from controlplane.policies.gateway_authorise import (
    authorise_evidence,
    authorise_identity,
    evidence_set,
)

ALICE = Principal("alice", "acme", True)
CAROL = Principal("carol", "beta", True)
ACME = Tenant("acme", NetworkPolicy.PRIVATE_ONLY, "shared-1")
SOURCES = {
    "doc-a": Source("doc-a", "acme", 3, True, frozenset({"alice", "bob", "carol"})),
    "doc-b": Source("doc-b", "acme", 1, True, frozenset({"alice", "bob", "carol"})),
    "doc-c": Source("doc-c", "acme", 2, True),
}
REL1 = (SourceRef("doc-a", 3), SourceRef("doc-b", 1))


def revoked(*refs: str) -> dict[str, Source]:
    return {name: Source(s.source_ref, s.tenant_id, s.current_version, name not in refs, s.readers)
            for name, s in SOURCES.items()}


def test_identity_denials_name_the_exact_problem() -> None:
    assert authorise_identity("acme", "ghost", None, ACME).code == "identity_unknown"
    assert authorise_identity("acme", "mallory", Principal("mallory", "acme", False),
                              ACME).code == "identity_revoked"
    mismatch = authorise_identity("acme", "carol", CAROL, ACME)
    assert mismatch.code == "tenant_mismatch" and mismatch.step is Step.AUTHORISE
    assert mismatch.reasons[0].facts["principal_tenant_id"] == "beta"
    assert authorise_identity("acme", "alice", ALICE, None).code == "tenant_unknown"
    assert authorise_identity("acme", "alice", ALICE, ACME).allowed


def test_an_active_readable_evidence_set_is_authorised() -> None:
    assert authorise_evidence(ALICE, REL1, SOURCES).allowed
    assert authorise_evidence(CAROL, REL1, SOURCES).allowed  # listed as a reader across tenants


def test_a_source_of_the_callers_own_tenant_is_readable_whatever_its_access_list() -> None:
    """Spec §5.1 step 3: the source belongs to the caller's tenant, or the caller's access list
    allows it. The list adds readers from other tenants; it never removes the owner's."""
    dave, erin = Principal("dave", "acme", True), Principal("erin", "beta", True)
    assert authorise_evidence(dave, REL1, SOURCES).allowed
    assert SOURCES["doc-a"].readable_by(dave)
    assert not SOURCES["doc-a"].readable_by(erin)
    assert not SOURCES["doc-c"].readable_by(CAROL)  # no list: its tenant's principals only
    denied = authorise_evidence(erin, REL1, SOURCES)
    assert denied.code == "source_forbidden"
    assert denied.reasons[0].facts["source_refs"] == ["doc-a", "doc-b"]


def test_partial_revocation_denies_listing_exactly_the_revoked_ref() -> None:
    verdict = authorise_evidence(ALICE, REL1, revoked("doc-b"))
    assert not verdict.allowed
    assert [r.code for r in verdict.reasons] == ["source_revoked"]
    assert verdict.reasons[0].facts["source_refs"] == ["doc-b"]


def test_every_revoked_ref_is_listed() -> None:
    verdict = authorise_evidence(ALICE, REL1, revoked("doc-a", "doc-b"))
    assert verdict.reasons[0].facts["source_refs"] == ["doc-a", "doc-b"]


def test_unknown_and_unreadable_sources_are_forbidden_before_revocation_is_reported() -> None:
    refs = (SourceRef("doc-c", 2), SourceRef("doc-x", 1), SourceRef("doc-a", 3))
    verdict = authorise_evidence(CAROL, refs, revoked("doc-a"))
    assert [r.code for r in verdict.reasons] == ["source_forbidden", "source_revoked"]
    assert verdict.reasons[0].facts["source_refs"] == ["doc-c", "doc-x"]


def test_a_caller_ref_at_an_old_version_is_stale_but_a_bundle_ref_is_not_checked() -> None:
    caller = (SourceRef("doc-c", 1),)
    verdict = authorise_evidence(ALICE, evidence_set(REL1, caller), SOURCES, caller)
    assert verdict.code == "source_stale"
    assert verdict.reasons[0].facts["stale"] == [{"source_ref": "doc-c", "version": 1,
                                                  "current_version": 2}]
    old_bundle = (SourceRef("doc-a", 2),)
    assert authorise_evidence(ALICE, old_bundle, SOURCES).allowed


def test_evidence_set_keeps_bundle_refs_first_and_drops_duplicates() -> None:
    merged = evidence_set(REL1, (SourceRef("doc-c", 2), SourceRef("doc-a", 3)))
    assert merged == (SourceRef("doc-a", 3), SourceRef("doc-b", 1), SourceRef("doc-c", 2))


@settings(max_examples=150, deadline=None)
@given(st.sets(st.sampled_from(["doc-a", "doc-b", "doc-c"])),
       st.lists(st.sampled_from(["doc-a", "doc-b", "doc-c"]), min_size=1, unique=True))
def test_evidence_is_authorised_exactly_when_no_ref_is_revoked(revoked_refs: set[str],
                                                                used: list[str]) -> None:
    refs = tuple(SourceRef(name, SOURCES[name].current_version) for name in used)
    verdict = authorise_evidence(ALICE, refs, revoked(*revoked_refs))
    hit = sorted(set(used) & revoked_refs)
    assert verdict.allowed == (not hit)
    if hit:
        assert verdict.reasons[0].facts["source_refs"] == hit
