"""FP8 in the graph: dequantize, keep and quantize, decided per conversion.

With a :class:`QuantContext` (the checkpoint's weight ↔ scale pairs and the model's FP8
parameters), building a conversion does one of three things (SPEC §8):

- **dequantize**: a paired FP8 source of a conversion whose targets are floating gets a
  ``DEQUANTIZE`` node (inputs: the weight's and the scale's reads), which replaces the
  read as the op chain's input: per expert, *before* merges, landing straight in the
  destination slice (placement pushes fragments back to it like to a read);
- **keep**: targets that are FP8 parameters with scale parameters take the FP8 bytes as
  they are, and :func:`add_scale_conversions` adds a sibling conversion that carries the
  scales through the same ops (:func:`~weightplan.planner.core.quant.scale_ops.scale_op`);
- **quantize**: a floating value headed for an FP8 parameter with a scale parameter gets
  two ``QUANTIZE`` nodes (weight and scale), each with its sink.

Whatever can't be done right is a problem on the plan (:func:`quant_problems`), which
``execute`` refuses; never a silent cast.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import chain, compress, repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import cast

import torch

from weightplan.errors import IndexGapError, QuantizationError
from weightplan.planner.inputs.checkpoint import Checkpoint, DirectoryRead
from weightplan.planner.inputs.fp8_model import Fp8Model, fp8_params
from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.inputs.fp8_pairs import Fp8Pairing, ScaledWeights, pair_scales, scale_key
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.inputs.quant_config import (
    QuantConfig, quant_config_in, quant_config_of_model, read_quant_config,
)
from weightplan.planner.keys.route import route_checkpoint
from weightplan.planner.keys.routing import Group, Routing
from weightplan.planner.keys.transforms import WeightTransform
from weightplan.planner.core.quant.blocks import FP8_DTYPES, E8M0, Block, block_of
from weightplan.planner.core.quant.kinds import Dequantize, Quantize
from weightplan.planner.tensors.ir.nodes import (
    DequantizeAttrs, Node, NodeKind, QuantizeAttrs, make_nodes, read_attrs, read_nodes,
    read_streams,
)
from weightplan.planner.core.ops.base import ConversionOp, Streams, stream_positions
from weightplan.planner.inputs.packed_pairs import PackedPairing, pair_packed
from weightplan.planner.inputs.packed_routing import kept_by_model, routed_entries
from weightplan.planner.inputs.small_reads import SmallReader
from weightplan.planner.inputs.quant_formats import read_format_config
from weightplan.planner.core.spec import TensorSpec, short_dtype


_KEY, _SPEC = attrgetter("key"), attrgetter("spec")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


@dataclass(frozen=True)
class QuantContext:
    """What the builder needs to place FP8 nodes."""

    pairing: Fp8Pairing
    model: Fp8Model | None
    config: QuantConfig | None  # the checkpoint's quantization_config
    keep_all: bool = False  # no model (convert / revert): FP8 stays FP8, scales follow
    packed: PackedPairing | None = None  # packed formats (MXFP4, compressed-tensors, NVFP4)

    def keeps(self, name: str) -> bool:
        return self.keep_all or (self.model is not None and name in self.model.params)


def memory_context(ckpt: Checkpoint) -> QuantContext | None:
    """For ``convert`` / ``revert`` of a dict: scaled FP8 weights stay FP8 and their scales
    go through the same ops (merged experts get merged scales)."""
    pairing = pair_scales(ckpt.entries, None)
    return QuantContext(pairing, None, None, keep_all=True) if pairing.pairs else None


def quant_context(source: object, ckpt: Checkpoint, info: ModelInfo | None,
                  model: object = None) -> QuantContext | None:
    """The checkpoint's pairs and the model's FP8 parameters (``None``: nothing FP8)."""
    checkpoint_config = checkpoint_quant_config(source)  # (first: a refusal names config.json)
    model_config = quant_config_of_model(model) if model is not None else None
    config = checkpoint_config or model_config
    packed = packed_pairing(source, ckpt)
    if info is not None:  # a model holding the stored tensors keeps them as they are
        packed = kept_by_model(packed, {name: t.spec.dtype for name, t in info.tensors.items()})
    plain = routed_entries(ckpt, packed)
    # (an empty one is still the answer: every entry a refused packed weight's part)
    pairing = pair_scales((ckpt if plain is None else plain).entries, config)
    if info is not None:  # (a packed copy in the model's layout)
        from weightplan.planner.inputs.layout_copy import refuse_layout_copy

        refuse_layout_copy(ckpt.entries, {n: t.spec.dtype for n, t in info.tensors.items()},
                           (packed.companions if packed else frozenset()) | pairing.companions)
    fp8_model = fp8_params(info, model_config or config) if info is not None else None
    has_model_fp8 = fp8_model is not None and (fp8_model.params or fp8_model.unscaled)
    if not pairing.quantized and not pairing.problems and not has_model_fp8 and packed is None:
        return None
    return QuantContext(pairing, fp8_model, config, packed=packed)


def packed_pairing(source: object, ckpt: Checkpoint) -> PackedPairing | None:
    """The packed-format pairs of a checkpoint directory with such a config."""
    if isinstance(source, DirectoryRead):
        fconfig = read_format_config(source.directory, source.config)
    elif isinstance(source, (str, Path)):
        path = Path(source)
        fconfig = read_format_config(path if path.is_dir() else path.parent)
    else:
        return None
    if fconfig is None:
        return None
    with SmallReader(ckpt.tensors) as read_small:
        return pair_packed(ckpt.entries, fconfig, read_small)


def checkpoint_quant_config(source: object) -> QuantConfig | None:
    """The quantization config next to a checkpoint on disk (a directory read: its config)."""
    if isinstance(source, DirectoryRead):
        return quant_config_in(source.config, source.directory / "config.json")
    if not isinstance(source, (str, Path)):
        return None
    path = Path(source)
    return read_quant_config(path if path.is_dir() else path.parent)


def routed_checkpoint(ckpt: Checkpoint, quant: QuantContext | None) -> Checkpoint:
    """The checkpoint routing sees: scales travel with their weights, not on their own."""
    if quant is not None and quant.packed is not None:
        routed = routed_entries(ckpt, quant.packed)
        ckpt = ckpt if routed is None else routed
    if quant is None or not quant.pairing.companions:
        return ckpt
    entries = dict(ckpt.entries)  # a copy keeps the order; deleting ~half is C-level
    deque(map(entries.pop, _in_order(quant.pairing), repeat(None)), maxlen=0)
    return replace(ckpt, entries=entries)


def route_quantized(ckpt: Checkpoint, quant: QuantContext,
                    transforms: Sequence[WeightTransform], info: ModelInfo | None) -> Routing:
    """:func:`route_checkpoint` of :func:`routed_checkpoint`. A stored weight refused by
    its pairing is left out of routing, so a merge of its stack finds a gap where the
    file holds the weight: that error carries the refusals (a missing part, say).

    Raises:
        QuantizationError: an index gap while stored weights were refused."""
    try:
        return route_checkpoint(routed_checkpoint(ckpt, quant), transforms, info)
    except IndexGapError as e:
        refused = quant.packed.problems if quant.packed is not None else ()
        if not refused:
            raise
        why = "; ".join(p.message for p in refused[:3])
        more = f" (and {len(refused) - 3} more)" if len(refused) > 3 else ""
        raise QuantizationError(f"{e}; the checkpoint's stored weights refused: {why}{more}"
                                ) from e


def _in_order(pairing: Fp8Pairing) -> Iterable[str]:
    """The companions, in checkpoint order where that is at hand: the scale keys of
    :class:`ScaledWeights` pairs (which are its companions), whose entries' order is the
    checkpoint's. Deleting 46k keys in that order takes half the time of the set's order,
    which jumps about the dict."""
    pairs, companions = pairing.pairs, pairing.companions
    if isinstance(pairs, ScaledWeights) and len(pairs) == len(companions):
        return map(_KEY, pairs.scales.values())
    return companions


def source_streams(group: Group, quant: QuantContext | None, expected: object,
                   dtype: torch.dtype | None) -> tuple[Streams[Node], list[Node]]:
    """The op chain's inputs: a read per source, each paired FP8 one behind a
    ``DEQUANTIZE`` node unless the conversion keeps FP8. Returns the values and the nodes
    made, in topological order: every read, then each dequantize after its scale's read.
    A stream's nodes are made in columns (:func:`~weightplan.planner.tensors.ir.nodes.make_nodes`)."""
    if quant is None or _keeps(group, quant):
        return read_streams(group.sources)
    scales_of: Mapping[str, TensorEntry] = quant.pairing.scales
    out_dtype = dequantized_dtype(group, expected, dtype)
    # the experts of a group share their specs and block: infer once per combination
    made: dict[tuple[int, int, int], tuple[TensorSpec, DequantizeAttrs]] = {}
    reads: list[Node] = []
    added: list[Node] = []
    streams = []
    bare: list[TensorEntry] = []  # FP8 sources without their scale
    for i, entries in enumerate(group.sources):
        sources: Sequence[tuple[int, int]] = stream_positions(i, len(entries))
        row = read_nodes(entries, sources)
        reads += row
        found = list(map(scales_of.get, map(_KEY, entries))) if scales_of else []
        if found and not all(found):  # (a stack's scales all found: nothing to look at)
            bare += [e for e, f in zip(entries, found, strict=True)
                     if f is None and e.spec.dtype in FP8_DTYPES]
        if not any(found):
            streams.append(tuple(row))
            continue
        assert quant is not None  # scales_of is empty without it
        weights, scaled, at = row, cast(list[TensorEntry], found), sources
        mixed = not all(found)  # some sources are not scaled FP8 weights: they stay reads
        if mixed:
            places = list(compress(range(len(found)), found))
            weights, at = list(map(row.__getitem__, places)), list(map(sources.__getitem__, places))
            scaled = list(filter(None, found))
        scales = read_nodes(scaled, at)
        dequantized = _dequantize(weights, scales, quant.pairing, made, out_dtype)
        added += chain.from_iterable(zip(scales, dequantized, strict=True))
        value = list(row) if mixed else dequantized
        if mixed:
            for j, node in zip(places, dequantized, strict=True):
                value[j] = node
        streams.append(tuple(value))
    if bare and added:  # (merged with dequantized siblings: no op can take raw FP8 there)
        raise QuantizationError(f"{group.targets[0]} merges dequantized weights but "
                                f"{_unscaled(bare)}", file=bare[0].file)
    return tuple(streams), reads + added


def _dequantize(weights: list[Node], scales: list[Node], pairing: Fp8Pairing,
                made: dict[tuple[int, int, int], tuple[TensorSpec, DequantizeAttrs]],
                dtype: torch.dtype) -> list[Node]:
    """The dequantize nodes of a stream's paired weights, each spec and attrs inferred
    once per (weight spec, scale spec, block), first to last (the first failing weight is
    named): once for a whole stack when its weights share one spec, its scales one spec
    and the pairing one block (DeepSeek-V3's 256 experts)."""
    wspecs, sspecs = list(map(_SPEC, weights)), list(map(_SPEC, scales))
    inputs = list(zip(weights, scales, strict=True))
    single = pairing.single_block
    # (the specs are shared objects, all alive while the group is built: ids are safe)
    if single is not None and wspecs.count(wspecs[0]) == len(wspecs) \
            and sspecs.count(sspecs[0]) == len(sspecs):  # (identity first: C speed)
        spec, attrs = _inferred(made, weights, wspecs, sspecs, [single[0]], 0, dtype)
        return make_nodes(NodeKind.DEQUANTIZE, repeat(spec), inputs, [attrs] * len(inputs))
    blocks = [pairing.pairs[read_attrs(w).entry.key].block for w in weights]
    seen = list(zip(map(id, wspecs), map(id, sspecs), map(id, blocks), strict=True))
    for key in dict.fromkeys(seen):  # each combination, in order of its first weight
        _inferred(made, weights, wspecs, sspecs, blocks, seen.index(key), dtype)
    hows = list(map(made.__getitem__, seen))
    return make_nodes(NodeKind.DEQUANTIZE, map(_FIRST, hows), inputs, list(map(_SECOND, hows)))


def _inferred(made: dict[tuple[int, int, int], tuple[TensorSpec, DequantizeAttrs]],
              weights: list[Node], wspecs: list[TensorSpec], sspecs: list[TensorSpec],
              blocks: list[Block], j: int, dtype: torch.dtype) -> tuple[TensorSpec, DequantizeAttrs]:
    """Weight ``j``'s dequantized spec and attrs, inferred unless its combination was."""
    key = (id(wspecs[j]), id(sspecs[j]), id(blocks[j]))
    if key not in made:
        made[key] = _dequantized(wspecs[j], sspecs[j], blocks[j], dtype,
                                 read_attrs(weights[j]).entry.key)
    return made[key]


def _dequantized(weight: TensorSpec, scale: TensorSpec, block: Block, dtype: torch.dtype,
                 key: str) -> tuple[TensorSpec, DequantizeAttrs]:
    spec = Dequantize(block, dtype).infer(weight, scale, key=key)
    return spec, DequantizeAttrs(dtype, block_of(weight.shape, block))


def _keeps(group: Group, quant: QuantContext) -> bool:
    return any(quant.keeps(name) for name in _target_names(group))


def _target_names(group: Group) -> tuple[str, ...]:
    if group.explicit is not None:
        return tuple(k for stream in group.explicit for k in stream)
    return group.targets


def dequantized_dtype(group: Group, expected: object, requested: torch.dtype | None
                      ) -> torch.dtype:
    """The model's dtype for the group's targets (``requested`` for meta ones), else the
    requested dtype, else bf16 (DeepSeek-V3's); the dtype the first op computes in, when it
    says (a LoRA merge: float32, rounded once after it)."""
    computes = group.ops[0].compute_dtype if group.ops else None
    if computes is not None:
        return computes
    if isinstance(expected, ModelInfo):
        for name in _target_names(group):
            mt = expected.get(name)
            if mt is not None and mt.spec.dtype.is_floating_point and mt.spec.dtype not in FP8_DTYPES:
                return requested if requested is not None and mt.on_meta else mt.spec.dtype
    return requested or torch.bfloat16


def quantize_nodes(key: str, value: Node, quant: QuantContext | None
                   ) -> tuple[Node, Node, str] | None:
    """``(weight node, scale node, scale key)`` when ``value`` goes to an FP8 parameter
    with a scale parameter and is floating; else ``None``."""
    if quant is None or quant.model is None or key not in quant.model.params:
        return None
    if value.spec.dtype in FP8_DTYPES:
        return None
    if not value.spec.dtype.is_floating_point:
        return None
    assert quant.model is not None
    param = quant.model.params[key]
    block = block_of(value.spec.shape, param.block)
    fmt = "ue8m0" if E8M0 is not None and param.scale_dtype == E8M0 else "float"
    q_spec, s_spec = Quantize(param.block, "exact" if param.exact else fmt).infer(value.spec,
                                                                                  key=key)
    weight = Node(NodeKind.QUANTIZE, q_spec, (value,),
                  QuantizeAttrs(q_spec.dtype, block, False, param.exact))
    scale = Node(NodeKind.QUANTIZE, s_spec, (value,),
                 QuantizeAttrs(s_spec.dtype, block, True, param.exact))
    return weight, scale, param.scale


def scale_format(attrs: QuantizeAttrs) -> str:
    if attrs.exact:
        return "exact"
    return "ue8m0" if E8M0 is not None and attrs.dtype == E8M0 else "float"


def _unscaled(entries: list[TensorEntry]) -> str:
    """Why each of ``entries`` has no pair: an FP8 weight's scale is missing or doesn't fit
    (its own problem says which), anything else is not FP8."""
    return "; ".join(f"{e.key} is {short_dtype(e.spec.dtype)} and has no {scale_key(e.key)} "
                     "that fits it" if e.spec.dtype in FP8_DTYPES else
                     f"{e.key} is {short_dtype(e.spec.dtype)}, not FP8" for e in entries)


def scale_group(group: Group, ops: tuple[ConversionOp, ...],
                specs: tuple[Streams[TensorSpec], ...], quant: QuantContext) -> Group:
    """The sibling group that carries the scales of a kept conversion through its ops.

    Raises:
        QuantizationError: a source has no scale, or an op cuts through blocks.
    """
    from weightplan.planner.core.quant.scale_ops import scale_op

    sources = []
    for stream in group.sources:
        pairs = [quant.pairing.pairs.get(e.key) for e in stream]
        missing = [e for e, p in zip(stream, pairs, strict=True) if p is None]
        if missing:
            raise QuantizationError(f"{group.targets[0]} keeps FP8 but {_unscaled(missing)}: "
                                    "load it into a floating model instead",
                                    key=group.targets[0])
        sources.append(tuple(p.scale for p in pairs if p is not None))
    block = quant.pairing.pairs[group.sources[0][0].key].block
    scale_ops = tuple(scale_op(op, tuple(s for stream in spec for s in stream), block,
                               key=group.targets[0]) for op, spec in zip(ops, specs, strict=True))
    converter = None
    if group.converter is not None:
        converter = replace(group.converter, operations=scale_ops)
    explicit = None if group.explicit is None else tuple(
        tuple(scale_key(k) for k in stream) for stream in group.explicit)
    return replace(group, converter=converter, sources=tuple(sources), explicit=explicit,
                   targets=tuple(scale_key(t) for t in group.targets),
                   operations=() if converter is not None else scale_ops)
