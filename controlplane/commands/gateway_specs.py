"""The inference gateway's value types: names, keys, digests, pricing and their bounds.

Shared by the gateway's commands (`controlplane.commands.gateway`); no command lives here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from controlplane.commands.base import MAX_GPU_MEMORY_GIB, MAX_TOKENS, Fraction, Frozen, Name

TenantName = Annotated[str, Field(min_length=1, max_length=100,
                                  pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@+-]*$")]
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=255,
                                      pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@+-]*$")]
Capability = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
Digest = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9:._-]*$")]
Tokens = Annotated[int, Field(strict=True, gt=0, le=MAX_TOKENS)]
Units = Annotated[int, Field(strict=True, ge=0, le=10**15)]
NetworkPolicyName = Literal["private_only", "hosted_allowed"]
MAX_INPUT_CHARACTERS = 4_000_000


class SourceRefSpec(Frozen):
    source_ref: Name
    version: Annotated[int, Field(strict=True, gt=0, le=10**9)]


class GpuPlanSpec(Frozen):
    """One replica of the route's fleet pool (configuration until pool capacity is connected)."""

    gpu_memory_gib: Annotated[float, Field(strict=True, gt=0, le=MAX_GPU_MEMORY_GIB,
                                           allow_inf_nan=False)]
    tensor_parallel_size: Annotated[int, Field(strict=True, gt=0, le=1_024)]
    max_concurrent_sequences: Annotated[int, Field(strict=True, gt=0, le=10_000_000)]
    usable_fraction: Fraction = 0.90
    runtime_overhead_gib: Annotated[float, Field(strict=True, ge=0, le=MAX_GPU_MEMORY_GIB,
                                                 allow_inf_nan=False)] = 0.0


# Bounds on route pricing, so every request's cost is a finite number the log can record: at
# most 2 x MAX_TOKENS x MAX_PRICE_PER_TOKEN = 2e14 units hosted, and at most
# MAX_COST_UNITS_PER_HOUR / (3,600 x MIN_BUSY_REQUESTS_PER_SECOND x MIN_UTILISATION), about 2.8e12,
# self-hosted. The ceilings sit far above any real tariff in any currency or sub-unit (a dear
# hosted model costs about 1e-4 dollars a token); the floors refuse a replica that serves less
# than one request every ~3 hours while busy, or is busy less than 0.1% of the time. A price of 0
# (a free route) is allowed: it makes a cost of 0, never an unrecordable one.
MAX_PRICE_PER_TOKEN = 1_000_000.0
MAX_COST_UNITS_PER_HOUR = 1_000_000_000.0
MIN_BUSY_REQUESTS_PER_SECOND = 0.000_1
MAX_BUSY_REQUESTS_PER_SECOND = 1_000_000.0
MIN_UTILISATION = 0.001
PricePerToken = Annotated[float, Field(strict=True, ge=0, le=MAX_PRICE_PER_TOKEN, allow_inf_nan=False)]


class TokenPricesSpec(Frozen):
    """A hosted route's tariff, in cost units per token."""

    input_price_per_token: PricePerToken
    output_price_per_token: PricePerToken


class ServingEconomicsSpec(Frozen):
    """A self-hosted replica's cost and throughput, spread over the requests it serves."""

    cost_units_per_hour: Annotated[float, Field(strict=True, ge=0, le=MAX_COST_UNITS_PER_HOUR,
                                                allow_inf_nan=False)]
    busy_requests_per_second: Annotated[float, Field(strict=True, ge=MIN_BUSY_REQUESTS_PER_SECOND,
                                                     le=MAX_BUSY_REQUESTS_PER_SECOND,
                                                     allow_inf_nan=False)]
    utilisation: Annotated[float, Field(strict=True, ge=MIN_UTILISATION, le=1, allow_inf_nan=False)]
