"""`fleetctl demo`: the whole path on the embedded default, in under a minute."""

from __future__ import annotations

import uuid
from typing import Any

import click

from controlplane.cli.context import settings_and_store
from controlplane.cli.output import emit, table
from controlplane.commands.memory import AssessMemory, DeploymentMemorySpec, ModelMemorySpec
from controlplane.replay import compare_with_live, verify_decisions
from events.verify import verify_chain
from workers.pipeline import submit as submit_commands
from workers.pipeline import wait_for_decisions

# Real architectures (research-data §1.1): parameters, layers, KV heads, head_dim.
DEMO_MODELS: list[tuple[str, int, int, int, int]] = [
    ("meta-llama/Llama-3.1-8B", 8_030_261_248, 32, 8, 128),
    ("mistralai/Mistral-7B-v0.3", 7_248_023_552, 32, 8, 128),
    ("google/gemma-2-9b", 9_241_705_984, 42, 8, 256),
    ("microsoft/Phi-3-mini-4k-instruct", 3_821_079_552, 32, 32, 96),
    ("meta-llama/Llama-3.1-70B", 70_553_706_496, 80, 8, 128),
]
# (label, GiB per GPU as the runtime reports it, tensor parallel size)
DEMO_DEPLOYMENTS: list[tuple[str, float, int]] = [
    ("L4", 22.03, 1), ("A100-80GB", 79.15, 1), ("H100-80GB x4", 79.19, 4),
]


def demo_commands(run_id: str) -> list[AssessMemory]:
    commands: list[AssessMemory] = []
    for model_name, parameters, layers, kv_heads, head_dim in DEMO_MODELS:
        for label, gib, tp in DEMO_DEPLOYMENTS:
            commands.append(AssessMemory(
                command_id=f"demo-{run_id}-{len(commands) + 1:03d}",
                correlation_id=f"demo-{run_id}",
                model_name=f"{model_name}@{label.replace(' ', '')}",
                model=ModelMemorySpec(parameters=parameters, weight_bits=16, layers=layers,
                                      kv_heads=kv_heads, head_dim=head_dim),
                deployment=DeploymentMemorySpec(
                    gpu_memory_gib=gib, tensor_parallel_size=tp, kv_shards=tp,
                    max_live_tokens_per_request=8_192, target_concurrency=16,
                    runtime_overhead_gib=2.0)))
    return commands


def _render(report: dict[str, Any]) -> str:
    rows = [[d["model"], d["outcome"], d["required_gib_per_gpu"], d["usable_gib_per_gpu"],
             d["max_concurrency"]] for d in report["decisions"]]
    lines = [f"decided {len(rows)} memory-fit commands through the queue and the log:", "",
             table(["model@gpus", "outcome", "required GiB/GPU", "usable GiB/GPU",
                    "max concurrency"], rows), "",
             f"replay: rebuilt projections "
             f"{'equal' if not report['projection_differences'] else 'DIFFER FROM'} the live ones",
             f"verify: {report['decisions_rederived']} decisions re-derived, "
             f"{'no drift' if not report['drifts'] else str(report['drifts']) + ' drifted'}",
             f"chain: {'intact' if report['chain_ok'] else 'BROKEN'} over "
             f"{report['events_checked']} events",
             "", "explore: fleetctl status | fleetctl log | fleetctl explain <command id>"]
    return "\n".join(lines)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def demo(as_json: bool) -> int:
    """Decide memory fit for real models through the queue, then replay and verify the log."""
    settings, store = settings_and_store()
    commands = demo_commands(uuid.uuid4().hex[:8])
    submit_commands(settings, store, commands)
    outcomes = wait_for_decisions(store, [c.command_id for c in commands], 120)
    decisions = []
    for command, outcome in zip(commands, outcomes, strict=True):
        data = outcome.events[0].data
        decisions.append({"command_id": command.command_id, "model": command.model_name,
                          "outcome": data["outcome"], **{k: data["result"][k] for k in (
                              "required_gib_per_gpu", "usable_gib_per_gpu", "max_concurrency")}})
    differences = compare_with_live(store)
    verified = verify_decisions(store)
    chain = verify_chain(store.read_all(raw=True), store.head())
    report = {"decisions": decisions, "projection_differences": differences,
              "decisions_rederived": verified.decisions_checked,
              "drifts": len(verified.drifts), "chain_ok": chain.ok,
              "events_checked": chain.events_checked}
    emit(report, as_json, _render)
    return 0 if not differences and verified.identical and chain.ok else 3
