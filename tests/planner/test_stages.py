"""A conversion's stages, read back from its nodes: cut straight from them where they lie
as the builder lays them out, else looked up by source; either way what the definition
(read by read, below) says."""

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weightplan import WeightConverter
from weightplan.ops import Concatenate, MergeModulelist
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.inputs.fp8_pairs import Fp8Pairing, ScaledWeight
from weightplan.planner.keys.routing import Group, Route
from weightplan.planner.tensors.ir.build import Conversion, SinkKind, build_conversion, stages
from weightplan.planner.tensors.ir import stages as ir_stages
from weightplan.planner.tensors.ir.nodes import Node, NodeKind, ReadAttrs
from weightplan.planner.tensors.ir.quant_build import QuantContext

FP8 = torch.float8_e4m3fn


def _definition(conv: Conversion):
    """Stage 0: the first read of each source, a dequantize in place of its weight's read;
    stage k: op k-1's outputs by position."""
    rows: list[dict] = [{}]
    for n in conv.nodes:
        if n.kind is NodeKind.READ:
            rows[0].setdefault(n.attrs.source, n)
        elif n.kind is NodeKind.DEQUANTIZE:
            rows[0][n.inputs[0].attrs.source] = n
        elif n.kind is NodeKind.OP:
            rows += [{} for _ in range(n.attrs.stage + 2 - len(rows))]
            rows[n.attrs.stage + 1][n.attrs.position] = n
    return tuple(tuple(tuple(row[(i, j)] for j in range(1 + max(j for a, j in row if a == i)))
                       for i in range(1 + max((i for i, _ in row), default=-1)))
                 for row in rows)


def _conversion(sizes: list[int], scaled: list[list[bool]]) -> Conversion:
    """Streams of ``sizes`` experts, those marked ``scaled`` FP8 with a scale (the others
    bf16), merged (and, for two or more streams, concatenated)."""
    weights, pairs = [], {}
    for s, (n, marks) in enumerate(zip(sizes, scaled, strict=True)):
        stream = []
        for j in range(n):
            dtype = FP8 if marks[j] else torch.bfloat16
            e = TensorEntry(f"e.{j}.w{s}", TensorSpec((256, 128), dtype), "f",
                            100_000 * s + 40_000 * j)
            if marks[j]:
                scale = TensorEntry(e.key + "_scale_inv", TensorSpec((2, 1), torch.float32),
                                    "f", e.offset + 32_768)
                pairs[e.key] = ScaledWeight(e, scale, (128, 128))
            stream.append(e)
        weights.append(tuple(stream))
    quant = QuantContext(Fp8Pairing(pairs, (), frozenset()), None, None) if pairs else None
    ops = [MergeModulelist(0)] + ([Concatenate(1)] if len(sizes) > 1 else [])
    converter = WeightConverter([f"e.*.w{s}" for s in range(len(sizes))], ["w"], ops)
    routes = tuple(tuple(Route(e.key, e.key, ()) for e in s) for s in weights)
    group = Group(converter, tuple(weights), routes, ("w",))
    return build_conversion(group, None, torch.bfloat16, SinkKind.MEMORY, quant)


@st.composite
def _conversions(draw):
    sizes = [draw(st.integers(1, 6))] * draw(st.integers(1, 3))  # (concatenated: alike)
    every = draw(st.sampled_from(["none", "all", "some"]))
    scaled = [[every == "all" or (every == "some" and draw(st.booleans())) for _ in range(n)]
              for n in sizes]
    return _conversion(sizes, scaled), draw(st.sampled_from(ORDERS))


ORDERS = ("as built", "reads reversed", "pairs reversed", "one more read", "in columns")


def _reordered(conv: Conversion, order: str) -> Conversion:
    """The nodes in another topological order, or with one more read (of a new source)."""
    nodes = conv.nodes
    count = next(i for i, n in enumerate(nodes) if n.kind is not NodeKind.READ)
    if order == "reads reversed":  # (reads have no inputs)
        nodes = (*nodes[:count][::-1], *nodes[count:])
    elif order == "pairs reversed":  # each (scale read, dequantize) pair kept together
        end = next((i for i, n in enumerate(nodes) if n.kind is NodeKind.OP), len(nodes))
        pairs = [nodes[i:i + 2] for i in range(count, end, 2)]
        nodes = (*nodes[:count], *(n for pair in pairs[::-1] for n in pair), *nodes[end:])
    elif order == "in columns":  # the scale reads, then the dequantizes (a packed stack's)
        end = next((i for i, n in enumerate(nodes) if n.kind is NodeKind.OP), len(nodes))
        middle = nodes[count:end]
        nodes = (*nodes[:count], *(n for n in middle if n.kind is NodeKind.READ),
                 *(n for n in middle if n.kind is not NodeKind.READ), *nodes[end:])
    elif order == "one more read":
        last = nodes[count - 1]
        i, j = last.attrs.source
        more = Node(NodeKind.READ, last.spec, (), ReadAttrs(last.attrs.entry, (i, j + 1)))
        nodes = (*nodes[:count], more, *nodes[count:])
    return dataclasses.replace(conv, nodes=nodes)


@settings(max_examples=200, deadline=None)
@given(_conversions())
def test_stages_are_what_the_definition_says(case):
    conv, order = case
    conv = _reordered(conv, order)
    assert stages(conv) == _definition(conv)


def test_a_built_stack_is_cut_straight_from_its_nodes_and_a_mixed_one_looked_up():
    def as_built(conv):
        counts = tuple(map(len, conv.group.sources))
        return ir_stages._as_built(conv.nodes, counts, [n.kind for n in conv.nodes])

    plain = _conversion([4, 4], [[False] * 4] * 2)
    fp8 = _conversion([4, 4], [[True] * 4] * 2)
    mixed = _conversion([4], [[True, False, True, True]])
    assert as_built(plain) == stages(plain)[0] == _definition(plain)[0]
    assert as_built(fp8) == stages(fp8)[0] == _definition(fp8)[0]
    columns = _reordered(fp8, "in columns")  # (as a packed stack's nodes lie)
    assert columns.nodes != fp8.nodes
    assert as_built(columns) == stages(columns)[0] == _definition(columns)[0]
    assert all(n.kind is NodeKind.DEQUANTIZE for s in stages(fp8)[0] for n in s)
    assert as_built(mixed) is None and stages(mixed) == _definition(mixed)
    more = _reordered(plain, "one more read")  # (of a source past the last)
    assert as_built(more) is None and stages(more) == _definition(more)
    moved = dataclasses.replace(plain, nodes=(plain.nodes[1], plain.nodes[0], *plain.nodes[2:]))
    assert as_built(moved) is None and stages(moved) == _definition(moved)
