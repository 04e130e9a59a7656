"""The gateway policy's parameters, versioned through the policy book like every policy."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class GatewayParameters(BaseModel):
    """Parameters of the gateway's decisions."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    # After this long without a recorded result a dispatching operation is reported as an unknown
    # outcome, and may be reconciled; it is never dispatched again either way.
    dispatch_lease_seconds: Annotated[float, Field(strict=True, gt=0, le=31_536_000)] = 900.0
