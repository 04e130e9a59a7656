"""Numeric formats for weights and the KV cache, and how many bits each element takes."""

from __future__ import annotations

from enum import StrEnum

from controlplane.catalog.errors import CatalogError


class DType(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"

    @property
    def bits(self) -> int:
        return _BITS[self]

    @property
    def is_float_compute(self) -> bool:
        """True for formats a runtime computes in (and so may cache KV in by default)."""
        return self in (DType.FP32, DType.BF16, DType.FP16)


_BITS = {DType.FP32: 32, DType.BF16: 16, DType.FP16: 16, DType.FP8: 8, DType.INT8: 8,
         DType.INT4: 4}

# Formats a KV cache may be stored in; integer KV is not a mainstream runtime option.
KV_DTYPES = (DType.FP32, DType.BF16, DType.FP16, DType.FP8)

_TORCH_NAMES = {"float32": DType.FP32, "float": DType.FP32, "bfloat16": DType.BF16,
                "float16": DType.FP16, "half": DType.FP16, "float8_e4m3fn": DType.FP8,
                "float8_e5m2": DType.FP8}


def parse_dtype(name: str, field: str) -> DType:
    """Read a dtype name (`bf16`, `fp8`, torch's `bfloat16`); unknown names raise CatalogError."""
    lowered = name.strip().lower()
    if lowered in _TORCH_NAMES:
        return _TORCH_NAMES[lowered]
    try:
        return DType(lowered)
    except ValueError:
        known = ", ".join(d.value for d in DType)
        raise CatalogError("dtype_unknown", field,
                           f"unknown dtype {name!r} (known: {known})") from None


def kv_element_bytes(dtype: DType) -> int:
    """Bytes per cached K or V element; refuses formats that are not KV cache formats."""
    if dtype not in KV_DTYPES:
        raise CatalogError("kv_dtype_unsupported", "kv_dtype",
                           f"{dtype.value} is not a KV cache format")
    return dtype.bits // 8
