"""Gateway select, bound and the admission pipeline over the spec's common fixture (§5, §10)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.gateway import (
    AdapterKind,
    DispatchRequest,
    GateStatus,
    GpuPlan,
    NetworkPolicy,
    NetworkPreference,
    Principal,
    Profile,
    ReleaseBundle,
    ReleasePointer,
    Route,
    Source,
    SourceRef,
    Step,
    Tenant,
)
from controlplane.policies.gateway_admission import Admission, GatewayView, admit
from controlplane.policies.gateway_bound import bound_request
from controlplane.policies.gateway_budget import BudgetState
from controlplane.policies.gateway_select import resolve_release, select_route
from controlplane.policies.memory import ModelMemory

MEMORY_8B = ModelMemory(8_000_000_000, 16, 32, 8, 128)
MEMORY_70B = ModelMemory(70_000_000_000, 16, 80, 8, 128)
PROVIDERS = frozenset({"selfhost", "hostedco"})
SMALL = Profile("chat-small-v1", "small-8b", "sha256:small", True, 8_192, 1_024,
                frozenset({"text"}), PROVIDERS, memory=MEMORY_8B)
LARGE = Profile("chat-large-v2", "large", "sha256:large", True, 32_768, 2_048,
                frozenset({"text", "tools"}), PROVIDERS, memory=MEMORY_8B)
BIG = Profile("chat-70b", "dense-70b", "sha256:70b", True, 8_192, 1_024, frozenset({"text"}),
              PROVIDERS, memory=MEMORY_70B)
PROFILES = {p.profile_id: p for p in (SMALL, LARGE, BIG)}
ALL = frozenset(PROFILES)
SH1 = Route("sh-1", AdapterKind.SELF_HOSTED, "selfhost", True, True, True, ALL, "pool-a",
            GpuPlan(80.0, 1, 8))
HC1 = Route("hc-1", AdapterKind.HOSTED, "hostedco", False, True, True, ALL)
HX1 = Route("hx-1", AdapterKind.HOSTED, "unvetted", False, True, True, frozenset({"chat-small-v1"}))
ROUTES = (SH1, HC1, HX1)
REL1 = ReleaseBundle("rel-1", "chat-small-v1", GateStatus.APPROVED,
                     (SourceRef("doc-a", 3), SourceRef("doc-b", 1)))
ACME = Tenant("acme", NetworkPolicy.PRIVATE_ONLY, "shared-1")
BETA = Tenant("beta", NetworkPolicy.HOSTED_ALLOWED, "shared-1")
ALICE = Principal("alice", "acme", True)
READERS = frozenset({"alice", "bob", "carol"})
SOURCES = {"doc-a": Source("doc-a", "acme", 3, True, READERS),
           "doc-b": Source("doc-b", "acme", 1, True, READERS),
           "doc-c": Source("doc-c", "acme", 2, True)}
VIEW = GatewayView(ACME, ALICE, ReleasePointer("acme/assistant", "acme", "rel-1", 1), REL1,
                   SOURCES, PROFILES, ROUTES, BudgetState("shared-1", 10_000))


def words(count: int) -> str:
    return " ".join(f"w{i}" for i in range(count))


def request(input_words: int = 100, max_output: int | None = 256, **fields: object) -> DispatchRequest:
    return DispatchRequest(**{"tenant_id": "acme", "principal_id": "alice", "idempotency_key": "k",
                              "pointer_name": "acme/assistant", "input_text": words(input_words),
                              "max_output_tokens": max_output, **fields})  # type: ignore[arg-type]


def denial_code(admission: Admission) -> str:
    assert admission.denial is not None
    return admission.denial.code


def chosen(routes: tuple[Route, ...], policy: NetworkPolicy = NetworkPolicy.PRIVATE_ONLY,
           bundle: ReleaseBundle = REL1) -> str:
    selection = select_route(bundle, PROFILES, routes, policy)
    return selection.route.route_id if selection.route else selection.verdict.code


def test_approved_dispatch_selects_the_private_self_hosted_route_and_reserves_356() -> None:
    admission = admit(request(), VIEW)
    assert admission.outcome == "admitted" and admission.plan is not None
    plan = admission.plan
    assert (plan.release_id, plan.profile_id, plan.route_id) == ("rel-1", "chat-small-v1", "sh-1")
    assert plan.evidence == REL1.source_refs
    assert (plan.input_tokens, plan.max_output_tokens, plan.grant_units) == (100, 256, 356)
    assert admission.budget_after == BudgetState("shared-1", 10_000, reserved_units=356)
    assert [s.step for s in admission.steps] == [Step.AUTHORISE, Step.SELECT, Step.AUTHORISE,
                                                 Step.SELECT, Step.BOUND, Step.RESERVE]


def test_a_route_that_is_not_ready_is_never_replaced_by_a_hosted_route() -> None:
    assert chosen((replace(SH1, ready=False), HC1, HX1)) == "route_not_ready"
    # The hosted route is legitimate only where the tenant allows it.
    assert chosen((replace(SH1, ready=False), HC1, HX1), NetworkPolicy.HOSTED_ALLOWED) == "hc-1"


def test_no_private_route_means_private_route_required() -> None:
    assert chosen((replace(SH1, private=False), HC1, HX1)) == "private_route_required"


def test_unknown_profile_and_unvetted_provider_are_denied_at_select() -> None:
    rogue = ReleaseBundle("rel-bad", "chat-rogue", GateStatus.APPROVED)
    assert chosen(ROUTES, bundle=rogue) == "profile_unknown"
    only_unvetted = (replace(SH1, compatible_profiles=frozenset()),
                     replace(HC1, compatible_profiles=frozenset()), HX1)
    assert chosen(only_unvetted, NetworkPolicy.HOSTED_ALLOWED) == "provider_not_approved"
    assert chosen((), NetworkPolicy.HOSTED_ALLOWED) == "no_compatible_route"


def test_an_unapproved_profile_or_a_digest_mismatch_is_untrusted() -> None:
    pinned = replace(REL1, profile_digest="sha256:other")
    assert chosen(ROUTES, bundle=pinned) == "profile_untrusted"
    unapproved = {**PROFILES, "chat-small-v1": replace(SMALL, approved=False)}
    assert select_route(REL1, unapproved, ROUTES, NetworkPolicy.HOSTED_ALLOWED).verdict.code == \
        "profile_untrusted"


def test_a_70b_bf16_profile_does_not_fit_the_self_hosted_plan_at_tp1() -> None:
    big = ReleaseBundle("rel-70b", "chat-70b", GateStatus.APPROVED)
    selection = select_route(big, PROFILES, ROUTES, NetworkPolicy.PRIVATE_ONLY)
    assert selection.verdict.code == "no_compatible_route"
    assert selection.verdict.reasons[0].facts["rulings"]["sh-1"] == "memory_does_not_fit"
    tp2 = replace(SH1, gpu_plan=GpuPlan(80.0, 2, 5))
    assert chosen((tp2, HC1), bundle=big) == "sh-1"


def test_a_self_hosted_route_that_cannot_show_the_memory_fit_is_not_compatible() -> None:
    """No GPU plan, or a profile without memory parameters: nothing shows the fit, so the route
    is ruled out as a misfit would be, never waved through (spec §5.1 step 4, §9)."""
    big = ReleaseBundle("rel-70b", "chat-70b", GateStatus.APPROVED)
    unplanned = replace(SH1, gpu_plan=None)
    assert chosen((unplanned, HC1), bundle=big) == "no_compatible_route"
    assert chosen((unplanned, HC1), NetworkPolicy.HOSTED_ALLOWED, bundle=big) == "hc-1"
    unsized = {**PROFILES, "chat-small-v1": replace(SMALL, memory=None)}
    selection = select_route(REL1, unsized, (SH1, HC1), NetworkPolicy.PRIVATE_ONLY)
    assert selection.verdict.code == "no_compatible_route"
    facts = selection.verdict.reasons[0].facts
    assert facts["rulings"] == {"hc-1": "private_route_required", "sh-1": "memory_fit_unproven"}
    assert facts["memory"] == [{"route_id": "sh-1", "profile_id": "chat-small-v1",
                                "missing": ["memory"]}]
    # A hosted route's memory is its provider's: it is not asked to show a fit.
    assert select_route(REL1, unsized, (HC1,), NetworkPolicy.HOSTED_ALLOWED).route == HC1


def test_route_choice_prefers_private_then_the_lowest_route_id() -> None:
    sh0 = replace(SH1, route_id="sh-0")
    assert chosen((SH1, HC1, sh0), NetworkPolicy.HOSTED_ALLOWED) == "sh-0"
    assert chosen((replace(SH1, private=False), HC1), NetworkPolicy.HOSTED_ALLOWED) == "hc-1"


def test_a_pointer_of_another_tenant_or_an_unapproved_release_is_denied() -> None:
    theirs = ReleasePointer("beta/assistant", "beta", "rel-1", 1)
    assert resolve_release("acme", "beta/assistant", theirs, REL1).code == "release_pointer_missing"
    pending = replace(REL1, gate_status=GateStatus.PENDING)
    pointer = ReleasePointer("acme/assistant", "acme", "rel-1", 1)
    assert resolve_release("acme", "acme/assistant", pointer, pending).code == "release_not_approved"


def test_context_and_output_bounds_match_the_spec_cases() -> None:
    def code(req: DispatchRequest) -> str:
        return bound_request(req, SMALL, ACME).verdict.code

    assert code(request(8_192, None)) == "input_too_large"
    assert code(request(100, 2_000)) == "output_limit_exceeded"
    assert code(request(7_500, 1_000)) == "context_window_exceeded"
    tools = bound_request(request(capabilities_requested=frozenset({"tools"})), SMALL, ACME)
    assert tools.verdict.code == "capability_not_allowed"
    assert tools.verdict.reasons[0].facts["capabilities"] == ["tools"]
    default = bound_request(request(100, None), SMALL, ACME)
    assert default.verdict.allowed and default.max_output_tokens == 1_024
    assert default.grant_units == 1_124


def test_bounds_are_inclusive_at_the_limits() -> None:
    assert bound_request(request(8_191, 1), SMALL, ACME).verdict.allowed
    assert bound_request(request(7_168, 1_024), SMALL, ACME).verdict.allowed
    assert bound_request(request(7_169, 1_024), SMALL, ACME).verdict.code == "context_window_exceeded"


def test_every_failing_bound_is_reported_in_a_fixed_order() -> None:
    everything = request(9_000, 2_000, capabilities_requested=frozenset({"vision"}),
                         network_preference=NetworkPreference.HOSTED)
    codes = [r.code for r in bound_request(everything, SMALL, ACME).verdict.reasons]
    assert codes == ["input_too_large", "output_limit_exceeded", "context_window_exceeded",
                     "capability_not_allowed", "network_policy_downgrade"]


def test_a_caller_cannot_loosen_but_may_tighten_the_network_policy() -> None:
    assert denial_code(admit(request(network_preference=NetworkPreference.HOSTED), VIEW)) == \
        "network_policy_downgrade"
    beta_view = replace(VIEW, tenant=BETA, principal=Principal("carol", "beta", True),
                        pointer=ReleasePointer("beta/assistant", "beta", "rel-1", 1),
                        routes=(replace(SH1, ready=False), HC1))
    carol = request(principal_id="carol", tenant_id="beta", pointer_name="beta/assistant")
    assert admit(carol, beta_view).plan.route_id == "hc-1"  # type: ignore[union-attr]
    strict = replace(carol, network_preference=NetworkPreference.PRIVATE)
    assert denial_code(admit(strict, beta_view)) == "route_not_ready"


def test_quota_is_checked_before_any_plan_exists_and_leaves_the_budget_unchanged() -> None:
    tight = replace(VIEW, budget=BudgetState("shared-1", 10_000, reserved_units=9_900))
    admission = admit(request(), tight)
    assert admission.denial is not None and admission.denial.code == "quota_exceeded"
    assert admission.denial.step is Step.RESERVE
    assert admission.plan is None and admission.budget_after is None
    assert admission.denial.reasons[0].facts["available_units"] == 100


def test_the_pointer_is_resolved_before_evidence_and_evidence_before_routes() -> None:
    revoked = {**SOURCES, "doc-b": replace(SOURCES["doc-b"], active=False)}
    no_pointer = replace(VIEW, pointer=None, bundle=None, sources=revoked)
    assert denial_code(admit(request(), no_pointer)) == "release_pointer_missing"
    broken = replace(VIEW, sources=revoked, routes=())
    denial = admit(request(), broken).denial
    assert denial is not None and (denial.step, denial.code) == (Step.AUTHORISE, "source_revoked")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
                min_size=3, max_size=3),
       st.sampled_from(list(NetworkPolicy)))
def test_a_chosen_route_always_satisfies_every_filter(flags: list[tuple[bool, bool, bool, bool]],
                                                      policy: NetworkPolicy) -> None:
    routes = tuple(replace(r, private=p, approved=a, ready=rd,
                           compatible_profiles=ALL if c else frozenset())
                   for r, (p, a, rd, c) in zip(ROUTES, flags, strict=True))
    selection = select_route(REL1, PROFILES, routes, policy)
    if selection.route is None:
        assert not selection.verdict.allowed
        return
    route = selection.route
    assert route.ready and route.approved and "chat-small-v1" in route.compatible_profiles
    assert route.provider in SMALL.approved_providers
    assert route.private or policy is NetworkPolicy.HOSTED_ALLOWED
