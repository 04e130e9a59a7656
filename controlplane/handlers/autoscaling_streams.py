"""What an `ObserveLoad` decision declares it touches: the streams it appends to, the rows it reads."""

from __future__ import annotations

from controlplane.commands.base import CommandBase
from controlplane.commands.traffic import ObserveLoad
from controlplane.decisions import INBOX_STREAM
from controlplane.state.admission import ADMISSION
from controlplane.state.autoscaling import AUTOSCALER
from controlplane.state.fleet import POOL


def autoscaler_stream(pool_id: str) -> str:
    """The stream of a pool's autoscaling decisions."""
    return f"autoscaler/{pool_id}"


def observe_load_streams(command: CommandBase) -> list[str]:
    """The autoscaler's stream, and the inbox its scale-ups issue placements to (the replicas
    a scale-down releases are found in the pool's row, so read while deciding)."""
    assert isinstance(command, ObserveLoad)
    return [autoscaler_stream(command.pool_id), INBOX_STREAM]


def observe_load_reads(command: CommandBase) -> list[tuple[str, str]]:
    """The rows a decision reads: the pool, its autoscaler and its admitted load."""
    assert isinstance(command, ObserveLoad)
    return [(POOL, command.pool_id), (AUTOSCALER, command.pool_id), (ADMISSION, command.pool_id)]
