"""A packed copy in the model's layout, met by a floating model: refused by name.

``weightplan convert SRC DST --mapping M`` without ``--dequantize`` keeps a packed
checkpoint's stored parts through the mapping, each under the model parameter's name plus
its role's suffix (``experts.gate_up_proj_packed``, ``_scale``, ``_shape``; FP8 and
ModelOpt: the parameter's own name holds the codes). Such a copy is for a model that holds
the format; the dequantizing load pairs the parts of the checkpoint's own per-module
layout (``M.weight_packed`` …) only. Loaded into a floating model, those parts matched
nothing: the fused weights were left to the model's init with a warning (int4), or
refused for a scale it looked for under another name (FP8) or a shape (ModelOpt). This
names the copy for what it is, before anything is read.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import torch

from weightplan.errors import QuantizationError
from weightplan.planner.core.entry import TensorEntry

# the role suffixes a kept copy writes after the parameter's name (packed_keep.py)
ROLE_SUFFIXES = ("_packed", "_scale", "_scale_2", "_zero_point", "_g_idx", "_global_scale",
                 "_shape", "_blocks", "_scales")


def layout_copy_parts(entries: Mapping[str, TensorEntry], model: Mapping[str, torch.dtype],
                      claimed: Collection[str]) -> list[tuple[str, str]]:
    """``(key, parameter)`` for each checkpoint key that is a floating model parameter's
    name plus a role suffix, claimed by no pairing, not a tensor of the model itself. A
    ``M.weight`` + suffix is the checkpoint's own per-module layout (a part whose weight is
    missing: the pairing's problem, not this)."""
    found = []
    for key in entries:
        if key in model or key in claimed or ".weight_" in key:
            continue
        for suffix in ROLE_SUFFIXES:
            name = key[:-len(suffix)] if key.endswith(suffix) else None
            dtype = model.get(name) if name else None
            if name and dtype is not None and dtype.is_floating_point and dtype.itemsize > 1:
                found.append((key, name))
                break
    return found


def refuse_layout_copy(entries: Mapping[str, TensorEntry], model: Mapping[str, torch.dtype],
                       claimed: Iterable[str]) -> None:
    """Raises:
        QuantizationError: the checkpoint is a packed copy in the model's layout.
    """
    found = layout_copy_parts(entries, model, frozenset(claimed))
    if not found:
        return
    key, name = found[0]
    raise QuantizationError(
        f"{key} (and {len(found) - 1} more) holds {name}'s quantized parts in the model's "
        "layout: a copy `weightplan convert` wrote keeping the packed weights (no "
        "--dequantize), for a model that holds the format; this model holds floating "
        f"{name}, and the dequantizing load reads the checkpoint's own per-module layout "
        "only. Convert the copy back (weightplan convert DIR BACK --mapping M --reverse) "
        "and load that, or write a dequantized copy from the original (weightplan convert "
        "SRC DST --dequantize)", key=key, file=entries[key].file)
