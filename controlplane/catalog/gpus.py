"""GPU types: memory a fit may use, bandwidth, supported number formats and interconnect class."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from controlplane.catalog.dtypes import DType, parse_dtype
from controlplane.catalog.errors import CatalogError


class LinkClass(StrEnum):
    NVLINK = "nvlink"
    XGMI = "xgmi"
    PCIE = "pcie"


class MemoryBasis(StrEnum):
    RUNTIME_REPORTED = "runtime_reported"  # what torch / the serving runtime reports as total
    NOMINAL_GB_CONVERTED = "nominal_gb_converted"  # vendor GB (10^9 B) expressed in GiB
    DECLARED = "declared"  # given by the operator for this fit


@dataclass(frozen=True)
class GpuType:
    """One GPU model; `memory_gib` is the total a memory fit multiplies by the usable fraction."""

    gpu_id: str
    name: str
    architecture: str
    aliases: tuple[str, ...]
    nominal_memory_gb: float
    memory_gib: float
    memory_gib_basis: MemoryBasis
    memory_bandwidth_gb_per_second: float
    bf16_dense_tflops: float | None
    fp8_dense_tflops: float | None
    dtypes: frozenset[DType]
    link_class: LinkClass
    link_gb_per_second_per_direction: float | None
    attribution: str

    def supports(self, dtype: DType) -> bool:
        """True when this GPU can compute or store `dtype` natively."""
        return dtype in self.dtypes


def parse_gpu(gpu_id: str, entry: Mapping[str, Any]) -> GpuType:
    """Build a GpuType from one catalog entry; missing or malformed fields raise CatalogError."""
    try:
        return GpuType(
            gpu_id=gpu_id,
            name=str(entry["name"]),
            architecture=str(entry["architecture"]),
            aliases=tuple(str(alias) for alias in entry.get("aliases", ())),
            nominal_memory_gb=_number(entry, "nominal_memory_gb", gpu_id),
            memory_gib=_number(entry, "memory_gib", gpu_id),
            memory_gib_basis=MemoryBasis(entry["memory_gib_basis"]),
            memory_bandwidth_gb_per_second=_number(entry, "memory_bandwidth_gb_per_second", gpu_id),
            bf16_dense_tflops=_optional_number(entry, "bf16_dense_tflops", gpu_id),
            fp8_dense_tflops=_optional_number(entry, "fp8_dense_tflops", gpu_id),
            dtypes=frozenset(parse_dtype(name, f"{gpu_id}.dtypes") for name in entry["dtypes"]),
            link_class=LinkClass(entry["link_class"]),
            link_gb_per_second_per_direction=_optional_number(
                entry, "link_gb_per_second_per_direction", gpu_id),
            attribution=str(entry["attribution"]),
        )
    except (KeyError, ValueError, TypeError) as error:
        if isinstance(error, CatalogError):
            raise
        raise CatalogError("catalog_entry_invalid", gpu_id,
                           f"GPU catalog entry {gpu_id!r} is malformed: {error!r}") from None


def _number(entry: Mapping[str, Any], key: str, gpu_id: str) -> float:
    value = _optional_number(entry, key, gpu_id)
    if value is None:
        raise CatalogError("catalog_entry_invalid", f"{gpu_id}.{key}",
                           f"{gpu_id}: {key} is required")
    return value


def _optional_number(entry: Mapping[str, Any], key: str, gpu_id: str) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise CatalogError("catalog_entry_invalid", f"{gpu_id}.{key}",
                           f"{gpu_id}: {key} must be a positive number")
    return float(value)
