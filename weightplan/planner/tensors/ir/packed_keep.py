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
leaves the op's error on the plan.

**Per-tensor scales** (ModelOpt's ``weight_scale_2`` of ``()``; compressed-tensors'
``weight_global_scale`` of ``(1,)``) are merged like their weights too: a ``()`` one is
first taken as the ``(1,)`` per-tensor grid (routing does it,
:func:`~weightplan.planner.keys.groups.as_grids`; here for a role group), so stacking E
experts gives ``(E, 1)`` and concatenating gate/up along the output dim gives
``(E, 2)``: one global scale per expert and projection, the layout of compressed-tensors'
fused experts (and vLLM's ``w13_weight_scale_2``). A model holding that grid with its size-1 dims dropped or added
(``(E,)``, ``(E, 2, 1)``) gets a :class:`~weightplan.planner.core.ops.layout.Reshape`; a
model holding *one* scalar for all of them gets a
:class:`~weightplan.planner.core.ops.layout.Collapse` when every value is the same bit
for bit (read at plan time, 4 bytes each), and a problem naming the tensors when they
differ. Saving runs the inverses: the per-expert ``()`` scalars come back bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from weightplan.errors import OpError
from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.core.ops.base import ConversionOp, OpContext, Streams
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.packed_pairs import PackedPairing
from weightplan.planner.inputs.packed_weight import PackedWeight, packed_weight
from weightplan.planner.keys.groups import as_grids, per_tensor
from weightplan.planner.keys.routing import Group

ReadBytes = Callable[[TensorEntry], bytes]
Problems = list[tuple[str, str]]


def kept_groups(groups: Sequence[Group], pairing: PackedPairing | None,
                held: Callable[[str], TensorSpec | None],
                entries: Callable[[str], TensorEntry | None], read: ReadBytes
                ) -> tuple[tuple[Group, ...], tuple[tuple[str, str], ...]]:
    """``groups`` with each kept packed group replaced by its role groups (see the module
    docstring), and the problems of per-tensor scales a model can't hold as they are;
    ``held``: the model's spec of a name, ``entries``: the checkpoint's entry of a key
    (``weight_shape``), ``read``: a small tensor's bytes (equal global scales)."""
    if pairing is None:
        return tuple(groups), ()
    out: list[Group] = []
    problems: Problems = []
    for group in groups:
        roles = _roles(group, held, entries) or [group]
        out += [fit_model(r, held, read, problems) for r in roles]
    return tuple(out), tuple(problems)


def modelopt_scalars(groups: Sequence[Group]) -> tuple[Group, ...]:
    """``groups`` (an inverse mapping's) with each split into ModelOpt ``weight_scale_2``
    tensors of ``(1,)`` ending in ``Reshape(())``: ModelOpt stores them as ``()``, and
    the ``(1,)`` grids a merge made of them split back into ``(1,)`` pieces."""
    return tuple(map(_modelopt_scalar, groups))


def _modelopt_scalar(group: Group) -> Group:
    if group.converter is None or not all(t.endswith(".weight_scale_2") for t in group.targets):
        return group
    outputs = _outputs(group)
    if outputs is None or {tuple(s.shape) for stream in outputs for s in stream} != {(1,)}:
        return group
    from weightplan.planner.core.ops.layout import Reshape

    return _with_ops(group, (*group.ops, Reshape(())))


def _with_ops(group: Group, ops: Sequence[ConversionOp]) -> Group:
    assert group.converter is not None
    return replace(group, converter=replace(group.converter, operations=tuple(ops)))


def fit_model(group: Group, held: Callable[[str], TensorSpec | None], read: ReadBytes,
              problems: Problems) -> Group:
    """A merge of per-tensor scales fitted to the layout the model holds (see the module
    docstring); other groups as they are."""
    if not per_tensor(group, ((), (1,))):
        return group
    group = as_grids(group)
    outputs = _outputs(group)
    if outputs is None:
        return group
    keys = [group.output_key(i, j) for i, stream in enumerate(outputs) for j in range(len(stream))]
    made = {tuple(s.shape) for stream in outputs for s in stream}
    want = {None if (h := held(k)) is None else tuple(h.shape) for k in keys}
    if len(made) != 1 or len(want) != 1 or None in want or made == want:
        return group
    (shape,), (target,) = made, want
    assert target is not None
    from weightplan.planner.core.ops.layout import Collapse, Reshape

    if [n for n in shape if n != 1] == [n for n in target if n != 1]:
        return _with_ops(group, (*group.ops, Reshape(target)))
    if math.prod(target) != 1:
        return group  # (the plan's shape mismatch says it)
    values = {read(e) for e in group.entries}
    if len(values) > 1:
        shown = ", ".join(f"{e.key}={_value(read(e), e.spec)}" for e in group.entries[:4])
        problems.append((keys[0], f"{group.entries[0].file or '<memory>'}: {keys[0]} holds one "
                         f"{list(target)} global scale for {len(group.entries)} per-tensor "
                         f"scales that differ ({shown}{', …' if len(group.entries) > 4 else ''})"
                         f": one value can't stand for them; give the model a {list(shape)} "
                         "scale (one per expert and projection), or dequantize"))
    return _with_ops(group, (*group.ops, Collapse(target)))


def _value(data: bytes, spec: TensorSpec) -> str:
    return repr(torch.frombuffer(bytearray(data), dtype=spec.dtype).reshape(-1)[0].item())


def _outputs(group: Group) -> Streams[TensorSpec] | None:
    """The op chain's output specs without a model (``None``: an op refuses; the builder
    reports it with the group)."""
    ctx = OpContext(group.targets, (None,) * len(group.targets),
                    tuple(tuple(e.key for e in s) for s in group.sources))
    specs: Streams[TensorSpec] = tuple(tuple(e.spec for e in s) for s in group.sources)
    try:
        for op in group.ops:
            specs = op.resolve(ctx, specs).infer(specs)
    except (OpError, RuntimeError):
        return None
    return specs


def _roles(group: Group, held: Callable[[str], TensorSpec | None],
           entries: Callable[[str], TensorEntry | None]) -> list[Group] | None:
    """The role groups of a kept group (``None``: not all packed, or not held)."""
    # (a source is packed when it is a PackedWeight, the pairing's logical entry)
    first = packed_weight(group.sources[0][0]) if group.sources and group.sources[0] \
        else None
    if first is None:
        return None
    suffixes = [p.key[len(first.key):] for p in first.parts]
    if _dtype(held(group.output_key(0, 0) + suffixes[0])) != first.parts[0].spec.dtype:
        return None  # (told first: a model that dequantizes holds none of them)
    packed: list[list[PackedWeight]] = []
    for stream in group.sources:
        row = list(map(packed_weight, stream))
        if not row or None in row:
            return None
        packed.append(row)  # type: ignore[arg-type]
    if any(w.scheme.roles != first.scheme.roles for row in packed for w in row):
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


def _dtype(spec: TensorSpec | None) -> torch.dtype | None:
    return None if spec is None else spec.dtype
