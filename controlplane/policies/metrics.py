"""Service-level gate: p95 TTFT, TPOT and end-to-end latency plus window throughput (spec §1.2)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controlplane.policies.reasons import Reason, require


@dataclass(frozen=True)
class RequestTrace:
    """One served request, timestamped on a clock shared by every trace of the window."""

    identifier: str
    arrived_at_seconds: float
    first_token_at_seconds: float
    completed_at_seconds: float
    output_tokens: int


@dataclass(frozen=True)
class ServiceObjectives:
    """The service-level objectives a window of traces is graded against."""

    max_p95_ttft_seconds: float
    max_p95_tpot_seconds: float
    max_p95_e2e_seconds: float
    min_output_tokens_per_second: float


@dataclass(frozen=True)
class ServiceReport:
    meets_objectives: bool
    p95_ttft_seconds: float
    p95_tpot_seconds: float
    p95_e2e_seconds: float
    output_tokens_per_second: float
    observation_window_seconds: float
    request_count: int
    reasons: tuple[Reason, ...]


@dataclass(frozen=True)
class ClassServiceReport:
    meets_objectives: bool
    reports: Mapping[str, ServiceReport]
    failing_classes: tuple[str, ...]
    reasons: tuple[Reason, ...]


_OBJECTIVE_FIELDS = ("max_p95_ttft_seconds", "max_p95_tpot_seconds", "max_p95_e2e_seconds",
                     "min_output_tokens_per_second")


def p95_nearest_rank(values: Sequence[float]) -> float:
    """The nearest-rank 95th percentile: the value at rank ceil(0.95 n) of the sorted values."""
    require(len(values) > 0, "percentile_of_nothing", "values", "no values to rank")
    ordered = sorted(values)
    # Integer arithmetic so the rank never depends on how 0.95 * n rounds in binary.
    rank = max(1, (95 * len(ordered) + 99) // 100)
    return ordered[rank - 1]


def _validate(traces: Sequence[RequestTrace], objectives: ServiceObjectives) -> None:
    require(len(traces) > 0, "traces_empty", "traces", "at least one request trace is required")
    for name in _OBJECTIVE_FIELDS:
        value = getattr(objectives, name)
        require(math.isfinite(value), "objective_not_finite", name, f"{name} must be finite")
        require(value >= 0, "objective_negative", name, f"{name} may not be negative")
    for index, trace in enumerate(traces):
        where = f"traces[{index}]"
        require(bool(trace.identifier.strip()), "trace_identifier_blank",
                f"{where}.identifier", "every trace needs an identifier")
        require(trace.output_tokens > 0, "output_tokens_not_positive",
                f"{where}.output_tokens", f"trace {trace.identifier!r} emitted no tokens")
        for name in ("arrived_at_seconds", "first_token_at_seconds", "completed_at_seconds"):
            require(math.isfinite(getattr(trace, name)), "timestamp_not_finite",
                    f"{where}.{name}", f"trace {trace.identifier!r} has a non-finite {name}")
        late_field = ("first_token_at_seconds"
                      if trace.first_token_at_seconds < trace.arrived_at_seconds
                      else "completed_at_seconds")
        ordered = (trace.arrived_at_seconds <= trace.first_token_at_seconds
                   <= trace.completed_at_seconds)
        require(ordered, "timestamps_impossible", f"{where}.{late_field}",
                f"trace {trace.identifier!r} has timestamps out of order")


def _tpot_seconds(trace: RequestTrace) -> float:
    # The first token is TTFT's; TPOT averages only the gaps between the tokens after it.
    if trace.output_tokens <= 1:
        return 0.0
    decode_seconds = trace.completed_at_seconds - trace.first_token_at_seconds
    return decode_seconds / (trace.output_tokens - 1)


def evaluate_service(traces: Sequence[RequestTrace],
                     objectives: ServiceObjectives) -> ServiceReport:
    """Grade a window against every objective; all violations are reported, equality passes."""
    _validate(traces, objectives)
    p95_ttft = p95_nearest_rank([t.first_token_at_seconds - t.arrived_at_seconds for t in traces])
    p95_tpot = p95_nearest_rank([_tpot_seconds(t) for t in traces])
    p95_e2e = p95_nearest_rank([t.completed_at_seconds - t.arrived_at_seconds for t in traces])
    window_seconds = (max(t.completed_at_seconds for t in traces)
                      - min(t.arrived_at_seconds for t in traces))
    # A zero window once divided to infinity and passed any minimum (spec §9 bug 2).
    require(window_seconds > 0, "observation_window_empty", "traces",
            "the traces span no time, so throughput is undefined")
    total_tokens = sum(t.output_tokens for t in traces)
    # One shared wall-clock window, never a sum of per-request rates.
    throughput = total_tokens / window_seconds
    # Finite inputs can still overflow (a window of 1e-320 s, timestamps 3e308 apart).
    require(all(map(math.isfinite, (p95_ttft, p95_tpot, p95_e2e, window_seconds, throughput))),
            "figures_not_finite", "traces", "the traces give latencies or throughput out of range")
    violations: list[Reason] = []
    if p95_ttft > objectives.max_p95_ttft_seconds:
        violations.append(Reason("p95_ttft_exceeded", "p95 time to first token is over objective",
                                 {"p95_ttft_seconds": p95_ttft,
                                  "max_p95_ttft_seconds": objectives.max_p95_ttft_seconds}))
    if p95_tpot > objectives.max_p95_tpot_seconds:
        violations.append(Reason("p95_tpot_exceeded", "p95 time per output token is over objective",
                                 {"p95_tpot_seconds": p95_tpot,
                                  "max_p95_tpot_seconds": objectives.max_p95_tpot_seconds}))
    if p95_e2e > objectives.max_p95_e2e_seconds:
        violations.append(Reason("p95_e2e_exceeded", "p95 end-to-end latency is over objective",
                                 {"p95_e2e_seconds": p95_e2e,
                                  "max_p95_e2e_seconds": objectives.max_p95_e2e_seconds}))
    if throughput < objectives.min_output_tokens_per_second:
        violations.append(Reason(
            "output_throughput_below_minimum", "output-token throughput is under the minimum",
            {"output_tokens_per_second": throughput, "output_tokens": total_tokens,
             "observation_window_seconds": window_seconds,
             "min_output_tokens_per_second": objectives.min_output_tokens_per_second}))
    reasons = tuple(violations) or (Reason(
        "service_objectives_met", "every service objective is met",
        {"p95_ttft_seconds": p95_ttft, "p95_tpot_seconds": p95_tpot,
         "p95_e2e_seconds": p95_e2e, "output_tokens_per_second": throughput}),)
    return ServiceReport(
        meets_objectives=not violations,
        p95_ttft_seconds=p95_ttft,
        p95_tpot_seconds=p95_tpot,
        p95_e2e_seconds=p95_e2e,
        output_tokens_per_second=throughput,
        observation_window_seconds=window_seconds,
        request_count=len(traces),
        reasons=reasons,
    )


def evaluate_service_by_class(
    traces_by_class: Mapping[str, Sequence[RequestTrace]],
    objectives_by_class: Mapping[str, ServiceObjectives],
) -> ClassServiceReport:
    """Grade each workload class only against its own objectives; one class cannot fail another."""
    require(len(objectives_by_class) > 0, "classes_empty", "objectives_by_class",
            "at least one workload class is required")
    for name in sorted(set(traces_by_class) | set(objectives_by_class)):
        require(bool(name.strip()), "class_name_blank", "objectives_by_class",
                "workload class names are required")
        require(name in objectives_by_class, "class_unknown", f"traces_by_class[{name}]",
                f"class {name!r} has traces but no objectives")
        require(len(traces_by_class.get(name, ())) > 0, "class_empty",
                f"traces_by_class[{name}]", f"class {name!r} has no traces")
    reports = {name: evaluate_service(traces_by_class[name], objectives_by_class[name])
               for name in sorted(objectives_by_class)}
    failing = tuple(name for name, report in reports.items() if not report.meets_objectives)
    reasons = tuple(
        Reason("class_objectives_missed", f"class {name!r} misses its objectives",
               {"workload_class": name,
                "violations": [reason.code for reason in reports[name].reasons]})
        for name in failing
    ) or (Reason("class_objectives_met", "every class meets its own objectives",
                 {"classes": list(reports)}),)
    return ClassServiceReport(meets_objectives=not failing, reports=reports,
                              failing_classes=failing, reasons=reasons)
