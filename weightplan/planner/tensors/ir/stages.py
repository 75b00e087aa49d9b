"""A conversion's stages, read back from its nodes: the values by position, stage by stage.

Stage 0 holds the op chain's inputs by source position (stream, index): each source's
read, or the dequantize in place of its weight's read (the scale's read, of the same
source, sits behind it); stage k holds the outputs of op k-1 by their position. The
nodes are the one description of a conversion, so lowering asks this module for the
stages instead of being told them. One algorithm, with one shortcut chosen by one test:
where the nodes lie as the builder lays them out (:func:`_as_built`: FP8 and packed
dequantizes alike), stage 0 is cut straight from them; anywhere else it is looked up by source (:func:`_by_source`).
"""

from __future__ import annotations

from functools import lru_cache
from itertools import accumulate, chain, compress, repeat
from operator import attrgetter, is_, itemgetter

from weightplan.errors import PlanError
from weightplan.planner.core.ops.base import ConversionOp, Streams, stream_positions
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.tensors.ir.nodes import Node, NodeKind, op_attrs

_KIND, _SPEC = attrgetter("kind"), attrgetter("spec")
_INPUTS, _SOURCE, _FIRST = attrgetter("inputs"), attrgetter("attrs.source"), itemgetter(0)


def read_stages(nodes: tuple[Node, ...], counts: tuple[int, ...], label: str,
                kinds: list[NodeKind] | None = None) -> tuple[Streams[Node], ...]:
    """The stages of a conversion's ``nodes`` (``counts``: its sources per stream; ``kinds``:
    the nodes' kinds, when the caller has them), in C-level passes: an FP8 stack has ~800.

    Raises:
        PlanError: a stage misses a position (nodes dropped from a built conversion).
    """
    kinds = list(map(_KIND, nodes)) if kinds is None else kinds
    first = _as_built(nodes, counts, kinds)
    if first is None:  # nodes in any other order
        first = _streams(label, 0, _by_source(nodes, kinds))
    if NodeKind.OP not in kinds:  # (no op: the reads are the only stage)
        return (first,)
    rows: list[dict[tuple[int, int], Node]] = []
    for n in compress(nodes, map(is_, kinds, repeat(NodeKind.OP))):
        a = op_attrs(n)
        rows += ({} for _ in range(a.stage + 1 - len(rows)))
        rows[a.stage][a.position] = n
    return (first, *(_streams(label, k + 1, row) for k, row in enumerate(rows)))


def _as_built(nodes: tuple[Node, ...], counts: tuple[int, ...], kinds: list[NodeKind]
              ) -> Streams[Node] | None:
    """Stage 0 cut straight from ``nodes`` when they lie as
    :func:`~weightplan.planner.tensors.ir.build.build_conversion` lays them out: every
    source's read first, in source order; then, when every source is dequantized, one
    dequantize per source, in the same order, each taking that read first (the other
    reads, its scale's or a packed weight's other parts, anywhere after: they read the
    sources already placed). ``None``: they lie otherwise (a stream partly dequantized, a
    read of another source, nodes made elsewhere)."""
    total = sum(counts)
    if kinds[:total].count(NodeKind.READ) != total:
        return None
    reads = nodes[:total]
    if list(map(_SOURCE, reads)) != dense_sources(counts):
        return None
    later = kinds[total:]  # (a plain key's: its sink; no dequantize, no other read)
    values = reads
    if NodeKind.DEQUANTIZE in later:
        values = tuple(compress(nodes[total:], map(is_, later, repeat(NodeKind.DEQUANTIZE))))
        if len(values) != total or tuple(map(_FIRST, map(_INPUTS, values))) != reads:
            return None  # (dequantized partly, or not in source order)
    if NodeKind.READ in later:
        others = compress(nodes[total:], map(is_, later, repeat(NodeKind.READ)))
        if not _placed(counts).issuperset(map(_SOURCE, others)):
            return None
    if len(counts) == 1:  # (one stream: all of them)
        return (values,)
    ends = accumulate(counts)
    return tuple(values[end - n:end] for n, end in zip(counts, ends, strict=True))


def _by_source(nodes: tuple[Node, ...], kinds: list[NodeKind]) -> dict[tuple[int, int], Node]:
    """Stage 0 by source position, from nodes in any order."""
    reads = list(compress(nodes, map(is_, kinds, repeat(NodeKind.READ))))
    reads.reverse()  # the first read of a source wins: a weight's, before its scale's
    first = dict(zip(map(_SOURCE, reads), reads, strict=True))
    dequantized = list(compress(nodes, map(is_, kinds, repeat(NodeKind.DEQUANTIZE))))
    first.update(zip(map(_SOURCE, map(_FIRST, map(_INPUTS, dequantized))), dequantized,
                     strict=True))
    return first


@lru_cache(maxsize=256)
def _placed(counts: tuple[int, ...]) -> frozenset[tuple[int, int]]:
    """:func:`dense_sources` as a set."""
    return frozenset(dense_sources(counts))


@lru_cache(maxsize=256)
def dense_sources(counts: tuple[int, ...]) -> list[tuple[int, int]]:
    """(stream, index) of ``counts[i]`` sources in each stream ``i``, in order (shared
    between calls: not to be changed)."""
    return list(chain.from_iterable(map(stream_positions, range(len(counts)), counts)))


def _streams(label: str, stage: int, row: dict[tuple[int, int], Node]) -> Streams[Node]:
    """``row`` by (stream, index): every stream, and every index of it, from 0 on."""
    streams: list[list[Node]] = []
    for i, j in sorted(row):
        streams += ([] for _ in range(i + 1 - len(streams)))
        if j != len(streams[i]):
            raise PlanError(f"{label}: stage {stage} of its graph has no node at "
                            f"{(i, len(streams[i]))}; every position of a stage must have one")
        streams[i].append(row[(i, j)])
    return tuple(map(tuple, streams))


def stage_op(stage: Streams[Node]) -> ConversionOp:
    """The op whose outputs stage ``stage`` holds."""
    return op_attrs(next(n for stream in stage for n in stream)).op


def stage_specs(stage: Streams[Node]) -> Streams[TensorSpec]:
    return tuple(tuple(map(_SPEC, stream)) for stream in stage)
