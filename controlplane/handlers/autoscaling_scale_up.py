"""The `PlaceReplica` commands a scale-up issues: shaped like the pool's latest placement, with
replica ids `<pool_id>-as<seq>` and command ids `<command_id>:place:<n>` (a digest in place of an
id too long to take the suffix within its limit)."""

from __future__ import annotations

import hashlib
from typing import Any

from controlplane.commands.fleet import PlaceReplica
from controlplane.commands.traffic import ObserveLoad
from controlplane.decisions import DecisionContext
from controlplane.state.fleet import REPLICA

MAX_COMMAND_ID = 100
MAX_NAME = 200


def _bounded(text: str, suffix: str, limit: int) -> str:
    """`text + suffix`, or a digest of `text` in its place when that would exceed `limit`."""
    if len(text) + len(suffix) <= limit:
        return text + suffix
    return hashlib.sha256(text.encode()).hexdigest()[:24] + suffix


def scale_up_placements(command: ObserveLoad, ctx: DecisionContext, row: dict[str, Any],
                        count: int) -> tuple[list[PlaceReplica], int]:
    """`count` placements shaped like the pool's latest one, and the replica sequence after."""
    template = row["replica_template"]
    children: list[PlaceReplica] = []
    seq = row["replicas_issued"]
    taken = set(row["pending_placements"])
    while len(children) < count:
        seq += 1
        replica_id = _bounded(command.pool_id, f"-as{seq}", MAX_NAME)
        if replica_id in taken or ctx.state.get(REPLICA, replica_id) is not None:
            continue
        children.append(PlaceReplica(
            command_id=_bounded(command.command_id, f":place:{len(children) + 1}", MAX_COMMAND_ID),
            at=command.at, actor="autoscaler", tenant=command.tenant,
            correlation_id=command.correlation_id or command.command_id,
            replica_id=replica_id, pool_id=command.pool_id, **template))
    return children, seq
