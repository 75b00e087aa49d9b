"""One stored weight of a packed checkpoint checked against its parts' headers
(:mod:`weightplan.planner.inputs.packed_pairs` checks one weight per layout): each part
present in a dtype the format allows, the logical shape (``weight_shape``'s values for
pack-quantized), every part's shape the one that shape needs; else the
:class:`PackedProblem` naming the file, key and expected shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.core.quant.formats import Scheme, companion_shapes, logical_shape
from weightplan.planner.core.spec import short_dtype
from weightplan.planner.inputs.packed_problems import PackedProblem
from weightplan.planner.inputs.packed_weight import PackedWeight

__all__ = ["pair_one"]

F8 = torch.float8_e4m3fn
_SCALES = (torch.float32, torch.bfloat16, torch.float16)
# role → the dtypes the format allows
_DTYPES: dict[str, dict[str, tuple[torch.dtype, ...]]] = {
    "mxfp4": {"blocks": (torch.uint8,), "scales": (torch.uint8,)},
    "fp8": {"weight": (F8,), "scale": _SCALES},
    "int": {"packed": (torch.int32,), "scale": _SCALES, "zero": (torch.int32,),
            "g_idx": (torch.int32, torch.int64)},
    "nvfp4": {"packed": (torch.uint8,), "scale": (F8,), "global": (torch.float32,)},
}
ReadOne = Callable[[TensorEntry], Sequence[int]]


def pair_one(logical: str, scheme: Scheme, names: dict[str, str],
             entries: Mapping[str, TensorEntry],
             read_small: ReadOne, file_of: Callable[[TensorEntry], str]
             ) -> PackedWeight | PackedProblem:
    first = entries[names[scheme.roles[0]]]
    where = f"{file_of(first)}: {logical}"
    if scheme.format == "int" and first.spec.dtype == torch.uint8:
        return PackedProblem(logical, f"{where}: {names['packed']} is u8 (NVFP4's packing) but "
                             "the config says pack-quantized (int32 words)")
    for role in scheme.roles:
        e = entries.get(names[role])
        if e is None:
            return PackedProblem(logical, f"{where}: {scheme.describe()} needs {names[role]} "
                                 "and the checkpoint has none; without it the weight can't be "
                                 "dequantized")
        if e.spec.dtype not in _DTYPES[scheme.format][role]:
            allowed = ", ".join(short_dtype(d) for d in _DTYPES[scheme.format][role])
            return PackedProblem(logical, f"{where}: {e.key} is {short_dtype(e.spec.dtype)}; "
                                 f"{scheme.describe()} stores it as {allowed}")
    shape = _shape(logical, scheme, names, entries, read_small, where)
    if isinstance(shape, PackedProblem):
        return shape
    expected = companion_shapes(scheme, shape)
    parts = tuple(entries[names[r]] for r in scheme.roles)
    for role, part in zip(scheme.roles, parts, strict=True):
        got, want = tuple(part.spec.shape), expected[role]
        if got != want and not (role == "global" and got in ((), (1,))) \
                and not (scheme.strategy == "tensor" and role == "scale" and got in ((), (1,))):
            return PackedProblem(logical, f"{where}: {part.key} is {list(got)} but a weight of "
                                 f"{list(shape)} in {scheme.describe()} needs {list(want)}")
    return PackedWeight(logical, scheme, parts, shape)


def _shape(logical: str, scheme: Scheme, names: dict[str, str], entries: Mapping[str, TensorEntry],
           read_small: ReadOne, where: str) -> tuple[int, ...] | PackedProblem:
    """The logical shape: from the stored weight, or ``weight_shape``'s values (int)."""
    first = entries[names[scheme.roles[0]]]
    packed = tuple(first.spec.shape)
    if len(packed) < (3 if scheme.format == "mxfp4" else 2):
        return PackedProblem(logical, f"{where}: {first.key} is {list(packed)}; a packed weight "
                             "is a [..., rows, cols] matrix")
    if scheme.format == "mxfp4" and packed[-1] != 16:
        return PackedProblem(logical, f"{where}: {first.key} is {list(packed)}; MXFP4 blocks "
                             "are 16 bytes (32 values) in the last dim")
    if scheme.format != "int":
        return logical_shape(scheme, packed)
    stored = entries.get(names["shape"])
    if stored is None:
        return PackedProblem(logical, f"{where}: pack-quantized needs {names['shape']} (the "
                             "weight's shape) and the checkpoint has none")
    if stored.spec.dtype.is_floating_point or len(stored.spec.shape) != 1 \
            or stored.spec.shape[0] != len(packed):
        return PackedProblem(logical, f"{where}: {stored.key} is {stored.spec}; it must hold "
                             f"{len(packed)} integers")
    shape = logical_shape(scheme, packed, read_small(stored))
    if shape[:-1] != packed[:-1] or shape[-1] < 1:
        return PackedProblem(logical, f"{where}: {stored.key} says {list(shape)} but "
                             f"{first.key} is {list(packed)}")
    return shape
