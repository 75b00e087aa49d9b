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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from itertools import compress, repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import cast

import torch

from weightplan.errors import QuantizationError
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.inputs.fp8_model import Fp8Model, fp8_params
from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.inputs.fp8_pairs import Fp8Pairing, ScaledWeights, pair_scales, scale_key
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.inputs.quant_config import (
    QuantConfig, quant_config_of_model, read_quant_config,
)
from weightplan.planner.keys.routing import Group
from weightplan.planner.core.quant.blocks import FP8_DTYPES, E8M0, Block, block_of
from weightplan.planner.core.quant.kinds import Dequantize, Quantize
from weightplan.planner.tensors.ir.nodes import (
    DequantizeAttrs, Node, NodeKind, QuantizeAttrs, dequantize_nodes, dequantize_stack,
    read_attrs, read_nodes,
)
from weightplan.planner.core.ops.base import ConversionOp, Streams, stream_positions
from weightplan.planner.tensors.ir.alike import AlikeReads, alike_reads
from weightplan.planner.inputs.packed_pairs import (
    PackedPairing, SmallReader, pair_packed, routed_entries,
)
from weightplan.planner.inputs.quant_formats import read_format_config
from weightplan.planner.core.spec import TensorSpec


_KEY, _SPEC = attrgetter("key"), attrgetter("spec")


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
    model_config = quant_config_of_model(model) if model is not None else None
    config = _checkpoint_config(source) or model_config
    packed = packed_pairing(source, ckpt)
    plain = routed_entries(ckpt, packed)
    pairing = pair_scales((plain or ckpt).entries, config)
    fp8_model = fp8_params(info, model_config or config) if info is not None else None
    has_model_fp8 = fp8_model is not None and (fp8_model.params or fp8_model.unscaled)
    if not pairing.quantized and not pairing.problems and not has_model_fp8 and packed is None:
        return None
    return QuantContext(pairing, fp8_model, config, packed=packed)


def packed_pairing(source: object, ckpt: Checkpoint) -> PackedPairing | None:
    """The packed-format pairs of a checkpoint directory with such a config."""
    if not isinstance(source, (str, Path)):
        return None
    path = Path(source)
    fconfig = read_format_config(path if path.is_dir() else path.parent)
    if fconfig is None:
        return None
    with SmallReader(ckpt.tensors) as read_small:
        return pair_packed(ckpt.entries, fconfig, read_small)


def _checkpoint_config(source: object) -> QuantConfig | None:
    if not isinstance(source, (str, Path)):
        return None
    path = Path(source)
    return read_quant_config(path if path.is_dir() else path.parent)


def routed_checkpoint(ckpt: Checkpoint, quant: QuantContext | None) -> Checkpoint:
    """The checkpoint routing sees: scales travel with their weights, not on their own."""
    if quant is not None and quant.packed is not None:
        ckpt = routed_entries(ckpt, quant.packed) or ckpt
    if quant is None or not quant.pairing.companions:
        return ckpt
    entries = dict(ckpt.entries)  # a copy keeps the order; deleting ~half is C-level
    deque(map(entries.pop, _in_order(quant.pairing), repeat(None)), maxlen=0)
    return replace(ckpt, entries=entries)


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
                   dtype: torch.dtype | None
                   ) -> tuple[Streams[Node], list[Node], tuple[AlikeReads | None, ...]]:
    """The op chain's inputs: a read per source, each paired FP8 one behind a
    ``DEQUANTIZE`` node unless the conversion keeps FP8. Returns the values, the nodes
    made, in topological order (every read, then each dequantize after its scale's read),
    and for each stream the parts all its reads share when they are alike
    (:func:`~weightplan.planner.tensors.lower.read_tasks.alike_reads`; ``None``: not known),
    told while the stream's entries are at hand. A stream's nodes are made in bulk
    (:func:`~weightplan.planner.tensors.ir.nodes.read_nodes`)."""
    scales_of: Mapping[str, TensorEntry] = {}
    out_dtype = torch.bfloat16  # unused unless something dequantizes
    if quant is not None and not _keeps(group, quant):
        scales_of, out_dtype = quant.pairing.scales, dequantized_dtype(group, expected, dtype)
    # the experts of a group share their specs and block: infer once per combination
    made: dict[tuple[int, int, int], tuple[TensorSpec, DequantizeAttrs]] = {}
    reads: list[Node] = []
    added: list[Node] = []
    streams = []
    alike: list[AlikeReads | None] = []
    for i, entries in enumerate(group.sources):
        sources = stream_positions(i, len(entries))
        row = read_nodes(entries, sources)
        reads += row
        found = _scales(scales_of, entries) if scales_of else []
        if not any(found):
            streams.append(tuple(row))
            alike.append(alike_reads(entries, None, None))
            continue
        mixed = not all(found)  # some sources are not scaled FP8 weights: they stay reads
        places = list(compress(range(len(found)), found)) if mixed else []
        paired = cast(list[TensorEntry], [found[j] for j in places] if mixed else found)
        weights, sub = ([row[j] for j in places], [sources[j] for j in places]) if mixed \
            else (row, sources)
        scales = read_nodes(paired, sub)
        assert quant is not None  # scales_of is empty without it
        dequantized, block = _dequantize(weights, scales, quant.pairing, made, out_dtype)
        pairs: list[Node] = [*scales, *dequantized]  # interleaved in place: no tuple per pair
        pairs[::2], pairs[1::2] = scales, dequantized
        added += pairs
        if mixed:
            by_place = dict(zip(places, dequantized, strict=True))
            dequantized = [by_place.get(j, read) for j, read in enumerate(row)]
        streams.append(tuple(dequantized))
        # one block for the whole stack (alike_reads checks the weights' specs; the
        # scales' are all equal when _dequantize infers once: the first stands for them)
        alike.append(None if mixed or block is None
                     else alike_reads(entries, [paired[0].spec] * len(paired), block))
    return tuple(streams), reads + added, tuple(alike)


def _scales(scales_of: Mapping[str, TensorEntry], entries: tuple[TensorEntry, ...]
            ) -> list[TensorEntry | None]:
    """Each entry's scale (``None``: not a scaled FP8 weight): a stack's in one look-up
    pass when all of them have one (the usual case), else one by one."""
    if len(entries) > 1:
        try:
            return list(itemgetter(*map(_KEY, entries))(scales_of))
        except KeyError:
            pass
    return list(map(scales_of.get, map(_KEY, entries)))


def _dequantize(weights: list[Node], scales: list[Node], pairing: Fp8Pairing,
                made: dict[tuple[int, int, int], tuple[TensorSpec, DequantizeAttrs]],
                dtype: torch.dtype) -> tuple[list[Node], tuple[int, ...] | None]:
    """The dequantize nodes of a stream's paired weights, and their one (resolved) block
    when a stack whose weights share one spec, scales one spec and pairs one block
    (DeepSeek-V3's 256 experts) was inferred once (``None``: inferred per combination)."""
    wspecs, sspecs = list(map(_SPEC, weights)), list(map(_SPEC, scales))
    single, count = pairing.single_block, len(weights)
    if single is not None and wspecs.count(wspecs[0]) == count \
            and sspecs.count(sspecs[0]) == count:  # identity first: C speed when shared
        key = (id(wspecs[0]), id(sspecs[0]), id(single[0]))
        if key not in made:
            made[key] = _dequantized(wspecs[0], sspecs[0], single[0], dtype,
                                     read_attrs(weights[0]).entry.key)
        return dequantize_stack(weights, scales, *made[key]), made[key][1].block
    blocks = [pairing.pairs[read_attrs(w).entry.key].block for w in weights]
    hows = _dequantize_hows(weights, wspecs, sspecs, blocks, made, dtype)
    return dequantize_nodes(weights, scales, map(itemgetter(0), hows),
                            list(map(itemgetter(1), hows))), None


def _dequantize_hows(weights: list[Node], wspecs: list[TensorSpec], sspecs: list[TensorSpec],
                     blocks: list[Block],
                     made: dict[tuple[int, int, int], tuple[TensorSpec, DequantizeAttrs]],
                     dtype: torch.dtype) -> list[tuple[TensorSpec, DequantizeAttrs]]:
    """Each weight's dequantized spec and attrs, inferred once per (weight spec, scale
    spec, block) combination, first to last (the first failing weight is named)."""
    seen = list(zip(map(id, wspecs), map(id, sspecs), map(id, blocks), strict=True))
    first = dict(zip(reversed(seen), range(len(seen) - 1, -1, -1), strict=True))  # → first place
    for j in sorted(first.values()):
        if seen[j] not in made:  # (all alive while the group is built: the ids are safe)
            made[seen[j]] = _dequantized(wspecs[j], sspecs[j], blocks[j], dtype,
                                         read_attrs(weights[j]).entry.key)
    return list(map(made.__getitem__, seen))


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
    requested dtype, else bf16 (DeepSeek-V3's)."""
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
    q_spec, s_spec = Quantize(param.block, fmt).infer(value.spec, key=key)
    weight = Node(NodeKind.QUANTIZE, q_spec, (value,), QuantizeAttrs(q_spec.dtype, block, False))
    scale = Node(NodeKind.QUANTIZE, s_spec, (value,), QuantizeAttrs(s_spec.dtype, block, True))
    return weight, scale, param.scale


def scale_format(attrs: QuantizeAttrs) -> str:
    return "ue8m0" if E8M0 is not None and attrs.dtype == E8M0 else "float"


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
        missing = [e.key for e, p in zip(stream, pairs, strict=True) if p is None]
        if missing:
            raise QuantizationError(f"{', '.join(missing)} is not a scaled FP8 weight, but "
                                    f"{group.targets[0]} keeps FP8: load it into a floating "
                                    "model instead", key=group.targets[0])
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
