"""Nodes made in bulk (a stream's reads, scale reads and dequantize nodes at once) are the
nodes, and have the hashes, that one-by-one construction gives."""

import torch

from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.inputs.fp8_pairs import Fp8Pairing, ScaledWeight
from weightplan.planner.keys.routing import Group
from weightplan.planner.core.quant.blocks import block_of
from weightplan.planner.core.quant.kinds import Dequantize
from weightplan.planner.tensors.ir.nodes import DequantizeAttrs, Node, NodeKind, ReadAttrs
from weightplan.planner.tensors.ir.quant_build import QuantContext, source_streams
from weightplan.planner.core.spec import TensorSpec

FP8 = torch.float8_e4m3fn


def _one_by_one(group: Group, pairs: dict[str, ScaledWeight], dtype: torch.dtype):
    reads, added, streams = [], [], []
    for i, entries in enumerate(group.sources):
        row = []
        for j, e in enumerate(entries):
            read = Node(NodeKind.READ, e.spec, (), ReadAttrs(e, (i, j)))
            reads.append(read)
            p = pairs.get(e.key)
            if p is None:
                row.append(read)
                continue
            scale = Node(NodeKind.READ, p.scale.spec, (), ReadAttrs(p.scale, (i, j)))
            spec = Dequantize(p.block, dtype).infer(e.spec, p.scale.spec, key=e.key)
            attrs = DequantizeAttrs(dtype, block_of(e.spec.shape, p.block))
            node = Node(NodeKind.DEQUANTIZE, spec, (read, scale), attrs)
            added += [scale, node]
            row.append(node)
        streams.append(tuple(row))
    return tuple(streams), reads + added


def _entry(key: str, shape: tuple[int, ...], dtype: torch.dtype, offset: int) -> TensorEntry:
    return TensorEntry(key, TensorSpec(shape, dtype), f"f{offset % 2}.safetensors", offset)


def test_bulk_nodes_equal_one_by_one_ones_with_mixed_and_paired_streams():
    weights = [[_entry(f"e.{s}.{j}.w", (256, 128), FP8, 1000 * s + j) for j in range(5)]
               for s in range(2)]
    weights[1][3] = _entry("e.1.3.w", (256, 128), torch.bfloat16, 77)  # not scaled: a read
    pairs = {}
    for stream in weights:
        for e in stream:
            if e.spec.dtype is FP8:
                scale = _entry(e.key + "_scale_inv", (2, 1), torch.float32, e.offset + 5)
                pairs[e.key] = ScaledWeight(e, scale, (128, 128))
    group = Group(None, tuple(map(tuple, weights)), ((), ()), ("a.*", "b.*"))
    quant = QuantContext(Fp8Pairing(pairs, (), frozenset()), None, None)

    values, nodes = source_streams(group, quant, None, torch.bfloat16)[:2]
    want_values, want_nodes = _one_by_one(group, pairs, torch.bfloat16)

    assert values == want_values and nodes == want_nodes
    assert [hash(n) for n in nodes] == [hash(n) for n in want_nodes]
    assert values[1][3].kind is NodeKind.READ and values[1][2].kind is NodeKind.DEQUANTIZE


def test_bulk_reads_without_pairs_are_plain_reads():
    entries = tuple(_entry(f"x.{j}", (4, 4), torch.float32, j) for j in range(3))
    group = Group(None, (entries,), ((),), ("x.*",))
    values, nodes = source_streams(group, None, None, None)[:2]
    want_values, want_nodes = _one_by_one(group, {}, torch.bfloat16)
    assert values == want_values and nodes == want_nodes
    assert [hash(n) for n in nodes] == [hash(n) for n in want_nodes]


def _stack(count: int, blocks=None):
    """``count`` FP8 experts (one shared spec) with their scales, paired as a dict."""
    from weightplan.planner.core.quant.blocks import scale_grid

    spec, pairs = TensorSpec((256, 128), FP8), {}
    for j in range(count):
        block = blocks[j] if blocks else (128, 128)
        e = TensorEntry(f"x.{j}.w", spec, "f", 100 * j)
        grid = TensorSpec(scale_grid(spec.shape, block), torch.float32)
        scale = TensorEntry(e.key + "_scale_inv", grid, "f", 100 * j + 50)
        pairs[e.key] = ScaledWeight(e, scale, block)
    return pairs


def test_a_stack_with_mixed_blocks_is_built_pair_by_pair():
    pairs = _stack(6, [(128, 128)] * 3 + [(128, 64)] * 3)
    group = Group(None, (tuple(p.weight for p in pairs.values()),), ((),), ("x.*",))
    quant = QuantContext(Fp8Pairing(pairs, (), frozenset()), None, None)
    assert quant.pairing.single_block is None
    values, nodes = source_streams(group, quant, None, torch.bfloat16)[:2]
    want_values, want_nodes = _one_by_one(group, pairs, torch.bfloat16)
    assert values == want_values and nodes == want_nodes
    assert [hash(n) for n in nodes] == [hash(n) for n in want_nodes]
    assert values[0][0].attrs.block != values[0][5].attrs.block


def test_paired_columns_build_the_nodes_of_their_pairs():
    from weightplan.planner.inputs.fp8_pairs import ScaledWeights, pair_scales

    pairs = _stack(7)
    entries = {e.key: e for p in pairs.values() for e in (p.weight, p.scale)}
    pairing = pair_scales(entries)
    assert isinstance(pairing.pairs, ScaledWeights) and dict(pairing.pairs) == pairs
    assert pairing.single_block == ((128, 128),) and pairing.activation_count == 0
    group = Group(None, (tuple(p.weight for p in pairs.values()),), ((),), ("x.*",))
    quant = QuantContext(pairing, None, None)
    values, nodes = source_streams(group, quant, None, torch.float16)[:2]
    want_values, want_nodes = _one_by_one(group, pairs, torch.float16)
    assert values == want_values and nodes == want_nodes
    assert [hash(n) for n in nodes] == [hash(n) for n in want_nodes]


def test_a_stack_that_cannot_dequantize_names_its_first_weight():
    import pytest

    from weightplan.errors import WeightplanError

    pairs = _stack(6)
    bad = TensorSpec((3, 3), torch.float32)  # not the (2, 1) grid of a 256×128 weight
    pairs = {k: p._replace(scale=TensorEntry(p.scale.key, bad, "f", p.scale.offset))
             for k, p in pairs.items()}
    group = Group(None, (tuple(p.weight for p in pairs.values()),), ((),), ("x.*",))
    quant = QuantContext(Fp8Pairing(pairs, (), frozenset()), None, None)
    with pytest.raises(WeightplanError) as bulk:
        source_streams(group, quant, None, torch.bfloat16)[:2]
    with pytest.raises(WeightplanError) as each:
        _one_by_one(group, pairs, torch.bfloat16)
    assert str(bulk.value) == str(each.value) and "x.0.w" in str(bulk.value)


def test_op_nodes_over_a_whole_stream_take_the_stream():
    from weightplan.planner.tensors.ir.build import _wired
    from weightplan.planner.core.ops.base import stream_positions

    pairs = _stack(6)
    group = Group(None, (tuple(p.weight for p in pairs.values()),), ((),), ("x.*",))
    values, _ = source_streams(group, None, None, None)[:2]
    whole = _wired(values, stream_positions(0, 6))
    assert whole is values[0]
    assert _wired(values, tuple((0, j) for j in range(6))) == whole
    assert _wired(values, ((0, 2), (0, 1))) == (values[0][2], values[0][1])


def test_make_nodes_are_the_constructors_nodes_for_any_count():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from weightplan.planner.tensors.ir.nodes import make_nodes, read_nodes

    @settings(max_examples=60, deadline=None)
    @given(st.integers(0, 9), st.booleans())
    def check(count, shared):
        entries = [_entry(f"k.{0 if shared else j}", (4, 2 + j % 3), FP8, j) for j in range(count)]
        sources = [(0, j) for j in range(count)]
        reads = read_nodes(entries, sources)
        want = [Node(NodeKind.READ, e.spec, (), ReadAttrs(e, s))
                for e, s in zip(entries, sources, strict=True)]
        assert reads == want and list(map(hash, reads)) == list(map(hash, want))
        scales = read_nodes(entries[::-1], sources)
        attrs = [DequantizeAttrs(torch.bfloat16, (2, 1 + j % 2)) for j in range(count)]
        specs = [TensorSpec((4, 2), torch.bfloat16)] * count
        pairs = list(zip(reads, scales, strict=True))
        made = make_nodes(NodeKind.DEQUANTIZE, specs, pairs, attrs)
        want = [Node(NodeKind.DEQUANTIZE, *row) for row in zip(specs, pairs, attrs, strict=True)]
        assert made == want and list(map(hash, made)) == list(map(hash, want))

    check()
