"""Kept packed weights through merges: one group per stored role, merged like the weight.

A model that holds a packed format's stored tensors under *its* names (fused experts:
``experts.gate_up_proj_packed``, ``experts.gate_up_proj_scale``, …) keeps them as they
are: each routed group whose sources are all packed weights, and whose first output with
the format's first suffix (``_packed``, ``_blocks``, ``""`` for FP8 and ModelOpt's
``weight``) the model holds in the stored dtype, becomes one group per role — the
packed bytes, the scales, the zero points, the global scales, ``g_idx`` and
``weight_shape`` — each reading that role's tensors and running the group's own op
chain (stacking experts stacks their scales; concatenating ``gate``/``up`` along the
output dim concatenates their per-row scales and zero points), into the output key
plus the role's suffix (the stored key less the logical key: ``M.weight_scale`` →
``_scale``). Plain reads and ops: placed, verified, recorded and saved back (each op's
inverse) bit for bit like any other conversion. A role whose tensors an op can't take
(a per-tensor scale of ``()`` concatenated) leaves the op's error on the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.inputs.packed_pairs import PackedPairing, PackedWeight
from weightplan.planner.keys.routing import Group


def kept_groups(groups: Sequence[Group], pairing: PackedPairing | None,
                held: Callable[[str], torch.dtype | None],
                entries: Callable[[str], TensorEntry | None]) -> tuple[Group, ...]:
    """``groups`` with each kept packed group replaced by its role groups (see the module
    docstring); ``held``: the model's dtype of a name, ``entries``: the checkpoint's entry
    of a key (``weight_shape``)."""
    if pairing is None or not pairing.weights:
        return tuple(groups)
    out: list[Group] = []
    for group in groups:
        out += _roles(group, pairing, held, entries) or [group]
    return tuple(out)


def _roles(group: Group, pairing: PackedPairing, held: Callable[[str], torch.dtype | None],
           entries: Callable[[str], TensorEntry | None]) -> list[Group] | None:
    """The role groups of a kept group (``None``: not all packed, or not held)."""
    weights = pairing.weights
    packed: list[list[PackedWeight]] = []
    for stream in group.sources:
        row = [weights.get(e.key) for e in stream]
        if not row or None in row:
            return None
        packed.append(row)  # type: ignore[arg-type]
    first = packed[0][0]
    suffixes = [p.key[len(first.key):] for p in first.parts]
    if any(w.scheme.roles != first.scheme.roles for row in packed for w in row) \
            or held(group.output_key(0, 0) + suffixes[0]) != first.parts[0].spec.dtype:
        return None
    roles = [[[w.parts[r] for w in row] for row in packed] for r in range(len(suffixes))]
    shapes = [[entries(w.key + "_shape") for w in row] for row in packed]
    if first.scheme.format == "int" and all(e is not None for row in shapes for e in row):
        roles.append(shapes)  # type: ignore[arg-type]
        suffixes.append("_shape")
    return [_role_group(group, role, suffix) for role, suffix in zip(roles, suffixes, strict=True)]


def _role_group(group: Group, sources: list[list[TensorEntry]], suffix: str) -> Group:
    explicit = None if group.explicit is None else tuple(
        tuple(k + suffix for k in stream) for stream in group.explicit)
    return replace(group, sources=tuple(tuple(s) for s in sources), explicit=explicit,
                   targets=tuple(t + suffix for t in group.targets))
