"""The ops adapters need: BlockDiagonal / BlockDiagonalSplit, Permute, Flatten / Unflatten,
each with its exact inverse (alone and in peft's packing chain, through convert/revert)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import weightplan
from weightplan import WeightConverter
from weightplan.errors import OpError
from weightplan.ops import (
    BlockDiagonal, BlockDiagonalSplit, Flatten, MergeModulelist, Permute, Unflatten,
)
from weightplan.planner.core.geometry import Fragment, Region, View
from weightplan.planner.core.ops import OpContext
from weightplan.planner.core.spec import TensorSpec

CTX = OpContext((), (), ())
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int8]


def _specs(*tensors):
    return tuple((TensorSpec.of(t),) for t in tensors)


@settings(max_examples=40, deadline=None)
@given(lead=st.lists(st.integers(1, 3), max_size=2), blocks=st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=2, max_size=4),
    dtype=st.sampled_from(DTYPES))
def test_block_diagonal_and_back(lead, blocks, dtype):
    tensors = [torch.randint(-9, 9, (*lead, r, c)).to(dtype) for r, c in blocks]
    op = BlockDiagonal().resolve(CTX, _specs(*tensors))
    (out,), = op.forward(tuple((t,) for t in tensors))
    assert op.infer(_specs(*tensors)) == ((TensorSpec.of(out),),)
    assert out.shape == (*lead, sum(r for r, _ in blocks), sum(c for _, c in blocks))
    r = c = 0
    for t, (rows, cols) in zip(tensors, blocks, strict=True):
        assert torch.equal(out[..., r:r + rows, c:c + cols], t)
        r, c = r + rows, c + cols
    assert int((out != 0).sum()) == sum(int((t != 0).sum()) for t in tensors)
    back = op.inverse().resolve(CTX, ((TensorSpec.of(out),),)).forward(((out,),))
    assert all(torch.equal(b, t) for (b,), t in zip(back, tensors, strict=True))


def test_split_refuses_values_off_the_diagonal():
    op = BlockDiagonalSplit(rows=(2, 2), cols=(1, 1))
    dense = torch.ones(4, 2)
    with pytest.raises(OpError, match="off the diagonal"):
        op.forward(((dense,),))


def test_block_diagonal_refuses_unlike_blocks():
    with pytest.raises(OpError, match="same leading dims"):
        BlockDiagonal().resolve(CTX, _specs(torch.zeros(2, 3, 1), torch.zeros(3, 3, 1)))
    with pytest.raises(OpError, match="expects"):
        BlockDiagonalSplit(rows=(1, 1), cols=(1, 1)).resolve(CTX, _specs(torch.zeros(3, 2)))


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=2, max_size=4), data=st.data())
def test_permute_and_flatten_invert(shape, data):
    t = torch.arange(torch.Size(shape).numel()).reshape(shape)
    dims = tuple(data.draw(st.permutations(range(len(shape)))))
    p = Permute(dims)
    assert torch.equal(p.inverse().forward(p.forward(((t,),)))[0][0], t)
    start = data.draw(st.integers(0, len(shape) - 1))
    end = data.draw(st.integers(start, len(shape) - 1))
    f = Flatten(start, end).resolve(CTX, _specs(t))
    (flat,), = f.forward(((t,),))
    assert f.infer_one(TensorSpec.of(t), 0) == TensorSpec.of(flat)
    assert torch.equal(f.inverse().forward(((flat,),))[0][0], t)


def test_unresolved_split_takes_equal_blocks_per_target():
    ctx = OpContext(("a", "b"), (None, None), ())
    op = BlockDiagonal().inverse().resolve(ctx, _specs(torch.zeros(2, 6, 4)))
    assert (op.rows, op.cols) == ((3, 3), (2, 2))
    with pytest.raises(OpError, match="equal"):
        BlockDiagonal().inverse().resolve(ctx, _specs(torch.zeros(5, 4)))


def test_unflatten_checks_sizes():
    with pytest.raises(OpError, match="multiply"):
        Unflatten(0, (3, 3)).resolve(CTX, _specs(torch.zeros(8)))
    with pytest.raises(OpError, match="permutation"):
        Permute((0, 0)).resolve(CTX, _specs(torch.zeros(2, 2)))


def test_peft_packing_converts_and_reverts():
    """Per-expert B pairs → (2·out, 2r·E), expert fastest; revert gives them back."""
    e, out, r = 3, 4, 2
    tensors = {f"experts.{i}.{w}.lora_B": torch.randn(out, r) for i in range(e)
               for w in ("w1", "w3")}
    mapping = [WeightConverter(["experts.*.w1.lora_B", "experts.*.w3.lora_B"], "experts.B",
                               [MergeModulelist(0), BlockDiagonal(), Permute((1, 2, 0)),
                                Flatten(1, 2, sizes=(2 * r, e))])]
    packed = weightplan.convert(tensors, mapping)["experts.B"]
    assert packed.shape == (2 * out, 2 * r * e)
    for i in range(e):  # column k·E + e: expert i's rank k
        assert torch.equal(packed[:out, i:r * e:e], tensors[f"experts.{i}.w1.lora_B"])
        assert torch.equal(packed[out:, r * e + i::e], tensors[f"experts.{i}.w3.lora_B"])
        assert not packed[:out, r * e + i::e].any()
    back = weightplan.revert({"experts.B": packed}, mapping)
    assert set(back) == set(tensors) and all(torch.equal(back[k], tensors[k]) for k in tensors)


def _placed(op, t, out):
    """``t`` written into a NaN destination of ``out``'s shape through ``op.place_one``;
    None when the op doesn't place."""
    dest = torch.full(out.shape, float("nan"))
    f = op.place_one(Fragment(Region.full(tuple(out.shape)), 0, View.contiguous(tuple(out.shape))),
                     TensorSpec.of(t), 0)
    if f is None:
        return None
    piece = t[tuple(slice(a, b) for a, b in zip(f.region.starts, f.region.stops, strict=True))]
    torch.as_strided(dest, f.view.shape, f.view.stride, f.view.offset).copy_(
        piece.reshape(f.view.shape))
    return dest


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data())
def test_permute_and_flatten_place_as_their_kernels(shape, data):
    """Placed reads land each element where the kernel puts it; a permutation keeping the
    last dim last always places (the rows stay contiguous), one moving it places only
    when the rows would not land element by element."""
    t = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    dims = tuple(data.draw(st.permutations(range(len(shape)))))
    (out,), = Permute(dims).forward(((t,),))
    placed = _placed(Permute(dims), t, out)
    if dims[-1] == len(shape) - 1:
        assert placed is not None
    if placed is not None:
        assert torch.equal(placed, out)
    start = data.draw(st.integers(0, len(shape) - 1))
    end = data.draw(st.integers(start, len(shape) - 1))
    f = Flatten(start, end).resolve(CTX, _specs(t))
    (flat,), = f.forward(((t,),))
    assert torch.equal(_placed(f, t, flat), flat)


def test_per_expert_lora_reads_straight_into_the_packed_factors(tmp_path):
    """The per-expert lora_A factors are read into their rows of the packed (E·r', in)
    parameter (no copy held); lora_B's packing writes the block-diagonal once, no flattened
    copy of it."""
    from tests.adapters.builders import MIXTRAL, per_expert_adapter
    from tests.adapters.test_experts import _injected

    d = str(tmp_path / "v4")
    per_expert_adapter(d, MIXTRAL)
    plan = weightplan.explain(_injected("mixtral", d), d)
    steps = [s for s in plan.schedule.steps if "lora_" in s.label and ".experts." in s.label]
    assert steps and not plan.problems
    for s in steps:
        if "lora_A" in s.label:
            assert not s.materialize and s.held_bytes == 0, s.label
        else:
            assert not any(isinstance(op, Flatten) for op in s.ops), s.label
