"""How `fleetctl status` shows the fleet to a person: one short table per read model."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from controlplane.cli.output import table
from controlplane.handlers.admission_pool import pool_capacity
from controlplane.policy_book import PolicyBook
from events.projections import MemoryProjections

Rows = dict[str, dict[str, Any]]


def _nodes(rows: Rows) -> str:
    body = []
    for node_id, node in rows.items():
        gpus = node["gpus"].values()
        free = [g for g in gpus if g["reserved_by"] is None]
        body.append([node_id, node["rack"], "yes" if node["cordoned"] else "no",
                     f"{len(free)}/{len(gpus)}", sum(g["memory_gib"] for g in free)])
    return table(["node", "rack", "cordoned", "free GPUs", "free GiB"], body)


def _replicas(rows: Rows) -> str:
    return table(["replica", "model", "pool", "state", "GPUs", "KV tokens"], [
        [rid, r["model_id"], r["pool_id"], r["state"],
         ",".join(f"{n}:{g}" for n, gs in sorted(r["gpus"].items()) for g in gs),
         r["kv_capacity_tokens"]] for rid, r in rows.items()])


def pool_budgets(projections: dict[str, Rows]) -> dict[str, int]:
    """Each pool's live-token budget as admission computes it: its ready replicas' KV capacity
    (the `pool` projection's `live_token_budget`, a capacity despite its name) times the
    admission policy's `live_token_budget_fraction` in force."""
    view = MemoryProjections()
    view.tables = projections  # read only, as the handlers read state
    policy = PolicyBook().in_force(view, "admission")
    return {pool_id: pool_capacity(view, pool_id, policy).budget_tokens
            for pool_id in projections.get("pool", {})}


def _pools(rows: Rows, budgets: dict[str, int] | None = None) -> str:
    budgets = budgets or {}
    return table(["pool", "ready", "warming", "ready KV tokens", "live-token budget"], [
        [pid, len(p["ready"]), len(p["warming"]), p["live_token_budget"], budgets.get(pid, "")]
        for pid, p in rows.items()])


def _memory_fit(rows: Rows) -> str:
    return table(["model", "fits", "required GiB/GPU", "usable GiB/GPU", "max concurrency"], [
        [name, "yes" if row["fits"] else "no", row["required_gib_per_gpu"],
         row["usable_gib_per_gpu"], row["max_concurrency"]] for name, row in rows.items()])


def _policies(rows: Rows) -> str:
    return table(["policy", "version", "parameters"], [
        [name, row["version"], ", ".join(f"{k}={v}" for k, v in sorted(row["parameters"].items()))]
        for name, row in rows.items()])


def _models(rows: Rows) -> str:
    return table(["model", "source", "parameters", "layers", "KV heads", "weight bits"], [
        [mid, m["source"], f"{m['memory']['parameters']:,}", m["memory"]["layers"],
         m["memory"]["kv_heads"], m["memory"]["weight_bits"]] for mid, m in rows.items()])


def _generic(rows: Rows) -> str:
    return table(["key", "value"], [[key, _short(value)] for key, value in rows.items()])


def _short(value: Any, limit: int = 90) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


VIEWS: dict[str, tuple[str, Callable[[Rows], str]]] = {
    "node": ("nodes", _nodes),
    "replica": ("replicas", _replicas),
    "pool": ("pools", _pools),
    "memory_fit": ("memory fit", _memory_fit),
    "policy": ("policies", _policies),
    "model": ("models", _models),
}
HIDDEN = {"entity", "pending"}
MAX_ROWS = 40


def render_status(report: dict[str, Any]) -> str:
    projections: dict[str, Rows] = report["projections"]
    lines = [f"position {report['requested_position']} is inside a decision's (or an effect's) "
             f"events: the state as of {report['position']}, before them"] \
        if "requested_position" in report else []
    lines.append(f"log position {report['position']}; "
                 f"{len(projections.get('pending', {}))} command(s) awaiting a decision")
    for name in sorted(projections, key=lambda n: (n not in VIEWS, n)):
        if name in HIDDEN or not projections[name]:
            continue
        title, view = VIEWS.get(name, (name, _generic))
        if name == "pool":  # the budget is derived: the report carries it beside the rows
            view = partial(_pools, budgets=report.get("pool_budgets"))
        rows = dict(list(projections[name].items())[:MAX_ROWS])
        more = len(projections[name]) - len(rows)
        lines += ["", f"{title} ({len(projections[name])})", view(rows)]
        if more:
            lines.append(f"… {more} more (use --json)")
    return "\n".join(lines)
