"""Tensor metadata known at plan time: shape and dtype, never bytes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# safetensors dtype names <-> torch dtypes. Names torch lacks are skipped at import. Only
# names safetensors itself knows (no C128: its reader refuses it, so we neither read nor
# write it).
_ST_NAMES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
    "C64": "complex64",
}
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, attr) for name, attr in _ST_NAMES.items() if hasattr(torch, attr)
}
TORCH_TO_SAFETENSORS: dict[torch.dtype, str] = {v: k for k, v in SAFETENSORS_DTYPES.items()}


def itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def short_dtype(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bf16"`` for tables."""
    name = TORCH_TO_SAFETENSORS.get(dtype, str(dtype).removeprefix("torch."))
    return name.lower()


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Shape and dtype of one tensor; ``nbytes`` follows from them."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize  # (numel * itemsize, inline)

    def meta(self) -> torch.Tensor:
        """An empty tensor on the ``meta`` device with this spec (for shape inference)."""
        return torch.empty(self.shape, dtype=self.dtype, device="meta")

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "TensorSpec":
        return cls(tuple(tensor.shape), tensor.dtype)

    def __str__(self) -> str:
        return f"{short_dtype(self.dtype)}{list(self.shape)}"


_DTYPE_NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "f32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "f16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float64": torch.float64,
    "fp64": torch.float64, "f64": torch.float64, "double": torch.float64,
}


def parse_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """``torch.bfloat16``, ``"bf16"``, ``"torch.float16"`` → a torch dtype (``None`` stays)."""
    from weightplan.errors import PlanError

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        name = dtype.lower().removeprefix("torch.")
        if name in _DTYPE_NAMES:
            return _DTYPE_NAMES[name]
    raise PlanError(f"unknown dtype {dtype!r}: use a torch dtype or one of "
                    f"{', '.join(sorted(_DTYPE_NAMES))}")
