"""The inference gateway's vocabulary: what its six steps read and what they decide (gateway spec §3).

Every input is a frozen dataclass built from folded state; every step answers with a
`StepVerdict` whose reasons carry stable codes and the deciding facts. Nothing here reads a clock,
a store or a provider.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from controlplane.policies.gateway_worksheet import ServingEconomics, TokenPrices
from controlplane.policies.memory import ModelMemory
from controlplane.policies.reasons import Reason, require


class NetworkPolicy(StrEnum):
    """A tenant's network boundary; `private_only` is the stricter of the two."""

    PRIVATE_ONLY = "private_only"
    HOSTED_ALLOWED = "hosted_allowed"


class NetworkPreference(StrEnum):
    """A caller's hint; it may tighten the tenant's policy, never loosen it."""

    PRIVATE = "private"
    HOSTED = "hosted"


class Step(StrEnum):
    """Where in the pipeline a decision was made (spec §1 and the audit `step`)."""

    AUTHORISE = "authorise"
    SELECT = "select"
    BOUND = "bound"
    RESERVE = "reserve"
    EXECUTE = "execute"
    PERSIST = "persist"
    REPLAY = "replay"


class TokenCounting(StrEnum):
    """How a profile counts a request's input tokens (spec §5.1 step 5: a deterministic stand-in
    in the lab, the profile's tokenizer in production).

    `whitespace_words` is the spec's stand-in and the default: it reproduces the reference
    figures, but a long input without spaces counts as one token. `utf8_bytes` counts one token
    per byte of the input's UTF-8 encoding: no byte-level BPE tokenizer (GPT-2, Llama 3 and
    Qwen style) makes more tokens than bytes, so the budget grant and the context-window check
    can never be undercut by the input's text; it counts about four times the tokens of English
    prose, and a chat template's special tokens, or a SentencePiece tokenizer's added prefix
    space, are not in it.
    """

    WHITESPACE_WORDS = "whitespace_words"
    UTF8_BYTES = "utf8_bytes"


class AdapterKind(StrEnum):
    HOSTED = "hosted"
    SELF_HOSTED = "self_hosted"


class GateStatus(StrEnum):
    APPROVED = "approved"
    REJECTED = "rejected"
    PENDING = "pending"


class OperationState(StrEnum):
    """The durable operation's states (spec §4); `dispatching` means "may have reached a provider"."""

    RESERVED = "reserved"
    DISPATCHING = "dispatching"
    COMPLETED = "completed"
    UNKNOWN = "unknown"
    FAILED = "failed"


@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    network_policy: NetworkPolicy
    budget_id: str
    # None: every capability the profile offers; otherwise the tenant's allow-list.
    allowed_capabilities: frozenset[str] | None = None


@dataclass(frozen=True)
class Principal:
    principal_id: str
    tenant_id: str
    active: bool


@dataclass(frozen=True)
class SourceRef:
    """One piece of evidence: a source at a version."""

    source_ref: str
    version: int


@dataclass(frozen=True)
class Source:
    """An evidence document's current status; `readers` is its access list: principals beyond
    its own tenant's that may read it."""

    source_ref: str
    tenant_id: str
    current_version: int
    active: bool
    readers: frozenset[str] = frozenset()

    def readable_by(self, principal: Principal) -> bool:
        """True when `principal` may read this source now: the source belongs to the principal's
        tenant, or its access list names the principal (spec §5.1 step 3, §6.2). A list never
        takes the source away from its own tenant."""
        return principal.tenant_id == self.tenant_id or principal.principal_id in self.readers


@dataclass(frozen=True)
class ReleaseBundle:
    """An immutable release: the profile it serves and the evidence it was built on."""

    release_id: str
    profile_id: str
    gate_status: GateStatus
    source_refs: tuple[SourceRef, ...] = ()
    profile_digest: str | None = None


@dataclass(frozen=True)
class ReleasePointer:
    pointer_name: str
    tenant_id: str
    release_id: str
    version: int


@dataclass(frozen=True)
class Profile:
    """A trusted profile; `input_limit_tokens` None means the context window minus one.
    `token_counting` is the rule its requests' input tokens are counted by."""

    profile_id: str
    model_id: str
    digest: str
    approved: bool
    context_window_tokens: int
    max_output_tokens: int
    capabilities: frozenset[str]
    approved_providers: frozenset[str]
    input_limit_tokens: int | None = None
    memory: ModelMemory | None = None
    token_counting: TokenCounting = TokenCounting.WHITESPACE_WORDS

    @property
    def effective_input_limit_tokens(self) -> int:
        if self.input_limit_tokens is not None:
            return self.input_limit_tokens
        return self.context_window_tokens - 1


@dataclass(frozen=True)
class GpuPlan:
    """How a self-hosted route's fleet pool lays one replica out (configuration until fleet state lands)."""

    gpu_memory_gib: float
    tensor_parallel_size: int
    max_concurrent_sequences: int
    usable_fraction: float = 0.90
    runtime_overhead_gib: float = 0.0


@dataclass(frozen=True)
class Route:
    """A way to serve a profile: a hosted provider, or a self-hosted fleet pool."""

    route_id: str
    adapter_kind: AdapterKind
    provider: str
    private: bool
    approved: bool
    ready: bool
    compatible_profiles: frozenset[str]
    pool: str | None = None
    gpu_plan: GpuPlan | None = None
    prices: TokenPrices | None = None
    economics: ServingEconomics | None = None


@dataclass(frozen=True)
class DispatchRequest:
    """What a caller asked for; `tenant_id` is the tenant the caller claims."""

    tenant_id: str
    principal_id: str
    idempotency_key: str
    pointer_name: str
    input_text: str
    max_output_tokens: int | None = None
    capabilities_requested: frozenset[str] = frozenset()
    network_preference: NetworkPreference | None = None
    source_refs: tuple[SourceRef, ...] = ()


@dataclass(frozen=True)
class StepVerdict:
    """One step's decision: allowed, or denied with one reason per failing gate (first = the code)."""

    step: Step
    allowed: bool
    reasons: tuple[Reason, ...]

    @property
    def outcome(self) -> str:
        return "allow" if self.allowed else "deny"

    @property
    def code(self) -> str:
        return self.reasons[0].code if self.reasons else ""


def allow(step: Step, code: str, message: str, **facts: object) -> StepVerdict:
    """An allowing verdict with one reason."""
    return StepVerdict(step, True, (Reason(code, message, facts),))


def deny(step: Step, reasons: list[Reason]) -> StepVerdict:
    """A denying verdict; `reasons` must name at least one failing gate."""
    require(bool(reasons), "denial_without_reason", "reasons", "a denial needs a reason")
    return StepVerdict(step, False, tuple(reasons))


def lease_expired(logical_seconds: float | None, wall_seconds: float | None,
                  lease_seconds: float) -> bool:
    """True only when a lease has run out on both clocks (spec §4, §13.2).

    `logical_seconds` is measured between commands' own times, which their submitter sets;
    None when the lease has not started. `wall_seconds` is measured on the control plane's
    clock (the log's `recorded_at`), which no submitter sets: a command dated ahead cannot end
    a lease early. None when the operation's row holds no such time (folded, and not rebuilt,
    from a log older than this rule): the logical clock alone judges it, as it did then.
    """
    if logical_seconds is None or logical_seconds < lease_seconds:
        return False
    return wall_seconds is None or wall_seconds >= lease_seconds


def count_input_tokens(input_text: str, rule: TokenCounting) -> int:
    """The input's tokens under `rule` (see `TokenCounting`)."""
    if rule is TokenCounting.UTF8_BYTES:
        return len(input_text.encode("utf-8"))
    return len(input_text.split())
