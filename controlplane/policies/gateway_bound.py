"""Bound: limits on input, output and capabilities; the caller cannot loosen the network policy
(spec §5.1 step 5).

Every failing gate is reported in a fixed order (input, output, context window, capabilities,
network policy); the first is the denial's code. The effective output maximum decided here is the
one written into the operation and handed to the adapter.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.policies.gateway import (
    DispatchRequest,
    NetworkPolicy,
    NetworkPreference,
    Profile,
    Step,
    StepVerdict,
    Tenant,
    TokenCounting,
    allow,
    count_input_tokens,
    deny,
)
from controlplane.policies.gateway_select import effective_network_policy
from controlplane.policies.reasons import Reason, require


@dataclass(frozen=True)
class Bounds:
    """The generation envelope: what the adapter may consume and produce."""

    verdict: StepVerdict
    input_tokens: int
    max_output_tokens: int
    network_policy: NetworkPolicy

    @property
    def grant_units(self) -> int:
        """The worst case the budget must cover: input plus the full output allowance (spec §8 Q3)."""
        return self.input_tokens + self.max_output_tokens


def _counted_by(profile: Profile) -> dict[str, str]:
    """The counting rule among a verdict's facts when it is not the spec's stand-in (whose
    records predate the choice and stay as they were)."""
    if profile.token_counting is TokenCounting.WHITESPACE_WORDS:
        return {}
    return {"token_counting": profile.token_counting.value}


def bound_request(request: DispatchRequest, profile: Profile, tenant: Tenant) -> Bounds:
    """Decide the envelope for `request` under `profile` and `tenant`; deny every limit it breaks."""
    require(request.max_output_tokens is None or request.max_output_tokens > 0,
            "max_output_tokens_not_positive", "max_output_tokens",
            "max_output_tokens must be positive when given")
    input_tokens = count_input_tokens(request.input_text, profile.token_counting)
    output_tokens = (request.max_output_tokens if request.max_output_tokens is not None
                     else profile.max_output_tokens)
    policy = effective_network_policy(tenant.network_policy, request.network_preference)
    input_limit = profile.effective_input_limit_tokens
    reasons: list[Reason] = []
    if input_tokens > input_limit:
        reasons.append(Reason("input_too_large", "the input exceeds the profile's input limit",
                              {"input_tokens": input_tokens, "limit_tokens": input_limit,
                               **_counted_by(profile)}))
    if output_tokens > profile.max_output_tokens:
        reasons.append(Reason("output_limit_exceeded", "requested output exceeds the profile maximum",
                              {"max_output_tokens": output_tokens,
                               "limit_tokens": profile.max_output_tokens}))
    if input_tokens + output_tokens > profile.context_window_tokens:
        reasons.append(Reason("context_window_exceeded", "input plus output exceed the context window",
                              {"total_tokens": input_tokens + output_tokens,
                               "context_window_tokens": profile.context_window_tokens,
                               **_counted_by(profile)}))
    allowed = profile.capabilities
    if tenant.allowed_capabilities is not None:
        allowed = allowed & tenant.allowed_capabilities
    refused = sorted(request.capabilities_requested - allowed)
    if refused:
        reasons.append(Reason("capability_not_allowed", "requested capabilities are not allowed",
                              {"capabilities": refused, "allowed": sorted(allowed)}))
    if (tenant.network_policy is NetworkPolicy.PRIVATE_ONLY
            and request.network_preference is NetworkPreference.HOSTED):
        reasons.append(Reason("network_policy_downgrade",
                              "the caller may not relax the tenant's network policy",
                              {"tenant_policy": tenant.network_policy.value,
                               "requested": request.network_preference.value}))
    if reasons:
        verdict = deny(Step.BOUND, reasons)
    else:
        verdict = allow(Step.BOUND, "within_bounds", "the request fits the profile's envelope",
                        input_tokens=input_tokens, max_output_tokens=output_tokens,
                        network_policy=policy.value, **_counted_by(profile))
    return Bounds(verdict, input_tokens, output_tokens, policy)
