"""``save(..., quantize="fp8")``: which written tensors are quantized, and how.

A model that was dequantized from an FP8 checkpoint is saved at its own dtype without
scales by default (exact for what it holds). With ``quantize="fp8"`` the tensors that
were FP8 in the loaded checkpoint (the load record says which, and their blocks) are
quantized again into ``*.weight`` + ``*.weight_scale_inv``; a model with no record gets
its linear-layer weights quantized (2-D or per-expert 3-D floating ``.weight`` /
``_proj`` tensors, not embeddings, ``lm_head``, norms or routers), in 128×128 blocks. A
model that kept FP8 writes its FP8 tensors and scales back as they are either way.

The save's conversions are built once; :func:`quantize_outputs` then turns each chosen
output's sink (and the cast before it) into the two quantize nodes and their sinks, as
the builder does for a load's FP8 parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from weightplan.errors import SaveError
from weightplan.planner.core.quant.blocks import FP8_DTYPES
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.fp8_model import Fp8Model, Fp8Param
from weightplan.planner.inputs.fp8_pairs import Fp8Pairing, scale_key
from weightplan.planner.inputs.quant_config import DEFAULT_BLOCK, QuantConfig
from weightplan.planner.tensors.ir.build import (
    Conversion, SinkKind, Target, TargetStatus, destination,
)
from weightplan.planner.tensors.ir.nodes import Node, NodeKind, SinkAttrs, sink_attrs
from weightplan.planner.tensors.ir.quant_build import QuantContext, quantize_nodes
from weightplan.planner.write.record import LoadRecord

QUANTIZE_CHOICES = (None, "fp8")
SKIPPED = ("embed", "lm_head", "norm", ".gate.", "router")


def check_quantize(quantize: object) -> None:
    if quantize not in QUANTIZE_CHOICES:
        raise SaveError(f"quantize={quantize!r}: use None (write what the model holds) or "
                        "'fp8' (block FP8 with weight_scale_inv, DeepSeek-V3 layout)")


def quantizable(key: str, spec: TensorSpec) -> bool:
    """The default for models without a record: linear weights (see the module docstring)."""
    floating = spec.dtype.is_floating_point and spec.dtype not in FP8_DTYPES
    named = key.endswith(".weight") or key.endswith("_proj")
    return floating and named and len(spec.shape) in (2, 3) and not any(s in key for s in SKIPPED)


def blocks_to_quantize(record: LoadRecord | None, outputs: Iterable[tuple[str, TensorSpec]]
                       ) -> dict[str, tuple[int, ...]]:
    """Output key → block: the record's dequantized keys, else the default rule."""
    if record is not None:
        recorded = {k: b for c in record.conversions for k, b in c.dequantized}
        if recorded:
            return recorded
    return {k: DEFAULT_BLOCK for k, spec in outputs if quantizable(k, spec)}


def quantization_config(blocks: Mapping[str, tuple[int, ...]]) -> dict | None:
    """The ``quantization_config`` that describes what was written (``None``: not FP8)."""
    if not blocks:
        return None
    found = set(map(tuple, blocks.values()))
    block = next(iter(found)) if len(found) == 1 else DEFAULT_BLOCK
    return QuantConfig(block=block).to_dict()


def quantize_outputs(conversions: Iterable[Conversion], blocks: Mapping[str, tuple[int, ...]],
                     *, exact: bool = False) -> tuple[Conversion, ...]:
    """``conversions`` with each written output in ``blocks`` quantized (a floating one;
    others are written as they are); ``exact``: re-encoded losslessly (power-of-two
    scales, an inexact tile an error: MXFP4 → FP8)."""
    params = {k: Fp8Param(k, scale_key(k), tuple(b), exact=exact) for k, b in blocks.items()}
    context = QuantContext(Fp8Pairing({}, (), frozenset()), Fp8Model(params, (), DEFAULT_BLOCK),
                           QuantConfig())
    return tuple(_quantized(conv, context) for conv in conversions)


def _quantized(conv: Conversion, context: QuantContext) -> Conversion:
    """One conversion's chosen sinks replaced by quantize → sink pairs, in place."""
    params = context.model.params if context.model is not None else {}
    targets = {t.key: t for t in conv.targets
               if t.status is TargetStatus.LOAD and t.key in params}
    if not targets:
        return conv
    nodes: list[Node] = []
    scales: list[Target] = []
    for n in conv.nodes:
        t = targets.get(sink_attrs(n).target) if n.kind is NodeKind.SINK else None
        cast = n.inputs[0] if t is not None and n.inputs[0].kind is NodeKind.CAST else None
        made = None if t is None else quantize_nodes(
            t.key, (cast or n).inputs[0], context)  # the value before its cast
        if t is None or made is None:
            nodes.append(n)
            continue
        if cast is not None:  # (the cast was this sink's alone, made just before it)
            if nodes and nodes[-1] is cast:
                nodes.pop()
            else:
                nodes = [m for m in nodes if m is not cast]
        weight, scale, key = made
        targets[t.key] = replace(t, dtype=weight.spec.dtype)
        scales.append(Target(key, scale.spec, t.position, None, None, scale.spec.dtype,
                             TargetStatus.LOAD))
        nodes += [weight, scale, _sink(weight, targets[t.key]), _sink(scale, scales[-1])]
    return Conversion(conv.group, tuple(targets.get(t.key, t) for t in conv.targets)
                      + tuple(scales), tuple(nodes))


def _sink(value: Node, target: Target) -> Node:
    return Node(NodeKind.SINK, value.spec, (value,), SinkAttrs(destination(target, SinkKind.FILE)))
