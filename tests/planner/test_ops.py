"""Every op: kernel vs plain torch, inference vs kernel, placement vs kernel, inverse."""

import pytest
import torch

from weightplan.errors import NotInvertibleError, OpError
from weightplan.ops import (
    Chunk, Concatenate, ConversionOp, Conv3dToLinear, LinearToConv3d, MergeModulelist,
    PermuteForRope, SplitModulelist, Transpose,
)
from weightplan.planner.core.geometry import Fragment, Region, View
from weightplan.planner.core.ops.base import OpContext
from weightplan.planner.core.spec import TensorSpec


def ctx(n_targets=1, target_shapes=None, config=None, source_keys=((),)):
    specs = tuple(TensorSpec(s, torch.float32) for s in target_shapes) if target_shapes else \
        (None,) * n_targets
    return OpContext(tuple(f"t{i}" for i in range(n_targets)), specs, source_keys, config)


def specs_of(streams):
    return tuple(tuple(TensorSpec.of(t) for t in s) for s in streams)


def run(op, streams, context=None):
    resolved = op.resolve(context or ctx(), specs_of(streams))
    return resolved, resolved.forward(streams)


def assemble_via_place(op, streams, outputs):
    """Write the inputs into destinations through ``op.place``; None when the op can't place."""
    dests, final = [], []
    for stream in outputs:
        row = []
        for t in stream:
            row.append((Fragment(Region.full(tuple(t.shape)), len(dests), View.contiguous(tuple(t.shape))),))
            dests.append(torch.full(tuple(t.shape), float("nan"), dtype=t.dtype))
        final.append(tuple(row))
    placed = op.place(tuple(final), specs_of(streams))
    if placed is None:
        return None
    for in_stream, frag_stream in zip(streams, placed, strict=True):
        for tensor, frags in zip(in_stream, frag_stream, strict=True):
            for f in frags:
                piece = tensor[tuple(slice(a, b) for a, b in zip(f.region.starts, f.region.stops, strict=True))]
                v = f.view
                torch.as_strided(dests[f.target], v.shape, v.stride, v.offset).copy_(piece.reshape(v.shape))
    return dests


def check(op, streams, context=None, expect_place=True):
    resolved, out = run(op, streams, context)
    assert resolved.infer(specs_of(streams)) == specs_of(out)
    placed = assemble_via_place(resolved, streams, out)
    if expect_place:
        assert placed is not None
        flat = [t for s in out for t in s]
        assert all(torch.equal(a, b) for a, b in zip(placed, flat, strict=True))
    back = resolved.inverse().resolve(ctx(len(streams), [t.shape for s in streams for t in s]
                                          if len(streams) > 1 else None), specs_of(out))
    return out, back.forward(out)


def r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_merge_then_concat_is_fused_experts():
    w1 = tuple(r(6, 8, seed=i) for i in range(4))
    w3 = tuple(r(6, 8, seed=10 + i) for i in range(4))
    _, merged = run(MergeModulelist(0), (w1, w3))
    resolved, fused = run(Concatenate(1), merged)
    expected = torch.cat([torch.stack(w1), torch.stack(w3)], dim=1)
    assert torch.equal(fused[0][0], expected)
    assert resolved.sizes == (6, 6)


def test_merge_modulelist_places_and_inverts():
    streams = (tuple(r(3, 5, seed=i) for i in range(4)),)
    out, back = check(MergeModulelist(0), streams)
    assert out[0][0].shape == (4, 3, 5)
    assert all(torch.equal(a, b) for a, b in zip(back[0], streams[0], strict=True))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_concatenate_places_and_inverts(dim):
    streams = ((r(4, 6, seed=1),), (r(4, 6, seed=2),), (r(4, 6, seed=3),))
    out, back = check(Concatenate(dim), streams)
    assert torch.equal(out[0][0], torch.cat([s[0] for s in streams], dim))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(back, streams, strict=True))


def test_chunk_sizes_come_from_target_parameters():
    qkv = (r(16, 8),)
    op, out = run(Chunk(0), (qkv,), ctx(3, [(8, 8), (4, 8), (4, 8)]))
    assert op.sizes == (8, 4, 4)
    assert [o[0].shape[0] for o in out] == [8, 4, 4]
    assert torch.equal(torch.cat([o[0] for o in out]), qkv[0])


def test_chunk_equal_when_targets_are_not_parameters():
    op, out = run(Chunk(1), ((r(4, 6),),), ctx(3))
    assert op.sizes == (2, 2, 2)


def test_chunk_that_cannot_split_raises():
    with pytest.raises(OpError, match="can't split"):
        Chunk(0).resolve(ctx(3), ((TensorSpec((16, 8), torch.float32),),))


@pytest.mark.parametrize("dim", [0, 1])
def test_chunk_places_and_inverts(dim):
    streams = ((r(6, 9),),)
    out, back = check(Chunk(dim), streams, ctx(3))
    assert torch.equal(back[0][0], streams[0][0])


def test_split_modulelist_squeezes_only_its_dim():
    stacked = r(3, 1, 5)
    out, back = check(SplitModulelist(0), ((stacked,),))
    assert [t.shape for t in out[0]] == [(1, 5)] * 3
    assert torch.equal(back[0][0], stacked)


@pytest.mark.parametrize("dims", [(0, 1), (1, 2), (-1, -2)])
def test_transpose_places_and_inverts(dims):
    streams = ((r(2, 3, 4),),)
    out, back = check(Transpose(*dims), streams)
    assert torch.equal(out[0][0], streams[0][0].transpose(*dims))
    assert torch.equal(back[0][0], streams[0][0])


def reference_permute(w, heads):
    rows, cols = w.shape
    return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def test_permute_for_rope_uses_per_tensor_head_counts():
    q, k = r(32, 8, seed=1), r(16, 8, seed=2)  # head_dim 8: 4 q heads, 2 kv heads (GQA)
    op, out = run(PermuteForRope(head_dim=8), ((q,), (k,)))
    assert torch.equal(out[0][0], reference_permute(q, 4))
    assert torch.equal(out[1][0], reference_permute(k, 2))


def test_permute_for_rope_head_dim_from_config_and_names():
    class Cfg:
        hidden_size, num_attention_heads = 32, 4
    q, v = r(32, 8, seed=1), r(16, 8, seed=2)
    context = OpContext(("a", "b"), (None, None), (("x.q_proj.weight",), ("x.v_proj.weight",)), Cfg())
    op, out = run(PermuteForRope(names=("q_proj",)), ((q,), (v,)), context)
    assert op.head_dim == 8 and op.mask == (True, False)
    assert torch.equal(out[0][0], reference_permute(q, 4)) and torch.equal(out[1][0], v)


def test_permute_for_rope_places_and_inverts_bias_too():
    for tensor in (r(32, 8), r(32)):
        out, back = check(PermuteForRope(head_dim=8), ((tensor,),))
        assert torch.equal(back[0][0], tensor)


def test_permute_for_rope_without_head_dim_raises():
    with pytest.raises(OpError, match="head_dim"):
        PermuteForRope().resolve(ctx(), ((TensorSpec((8, 4), torch.float32),),))


def test_conv3d_linear_round_trip():
    w = r(6, 3, 2, 4, 4)
    out, back = check(Conv3dToLinear(3, (2, 4, 4)), ((w,),))
    assert out[0][0].shape == (6, 96)
    assert torch.equal(back[0][0], w)
    out, back = check(LinearToConv3d(3, (2, 4, 4)), ((out[0][0],),))
    assert torch.equal(out[0][0], w)


def test_conv3d_shape_checked_at_plan_time():
    with pytest.raises(OpError, match="expects"):
        Conv3dToLinear(3, 2).resolve(ctx(), ((TensorSpec((6, 4, 2, 2, 2), torch.float32),),))


def test_user_op_defaults():
    class Scale(ConversionOp):
        def forward(self, streams):
            return tuple(tuple(t * 2 for t in s) for s in streams)

    op = Scale()
    specs = ((TensorSpec((2, 3), torch.float16),),)
    assert op.infer(specs) == specs
    assert op.wiring(specs) == ((((0, 0),),),)
    assert op.place(((),), specs) is None
    with pytest.raises(NotInvertibleError):
        op.inverse()


def test_op_reprs_hide_resolved_fields():
    assert repr(Chunk(0)) == "Chunk(dim=0)"
    assert repr(PermuteForRope(head_dim=64)) == "PermuteForRope(head_dim=64)"
    assert repr(Transpose(1, 2)) == "Transpose(dim0=1, dim1=2)"


def test_reshape_views_and_inverts():
    from weightplan.ops import Reshape

    scalars = ((torch.tensor(2.5), torch.tensor(-0.0)),)
    out, back = check(Reshape((1,)), scalars, expect_place=False)
    assert [tuple(t.shape) for t in out[0]] == [(1,), (1,)]
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32))
               for a, b in zip(back[0], scalars[0], strict=True)) and back[0][0].shape == ()
    grid = ((r(4, 1),),)
    out, back = check(Reshape((4,)), grid, expect_place=False)
    assert torch.equal(out[0][0], grid[0][0].reshape(4)) and torch.equal(back[0][0], grid[0][0])
    with pytest.raises(OpError, match="elements"):
        Reshape((3,)).resolve(ctx(), specs_of(grid))
    with pytest.raises(OpError, match="disagree"):
        Reshape((1,)).resolve(ctx(), specs_of(((torch.zeros(()), torch.zeros(1)),)))


def test_collapse_takes_one_of_equal_values_and_expands_back():
    from weightplan.ops import Collapse, Expand

    same = ((torch.full((4, 2), 3.0e-5),),)
    out, back = check(Collapse(()), same, expect_place=False)
    assert out[0][0].shape == () and out[0][0].item() == same[0][0][0, 0].item()
    assert torch.equal(back[0][0], same[0][0])
    out, back = check(Expand((4, 2)), ((torch.tensor(1.5),),), expect_place=False)
    assert torch.equal(out[0][0], torch.full((4, 2), 1.5)) and back[0][0].shape == ()
    differ = ((torch.tensor([[1.0, 1.0], [1.0, 2.0]]),),)
    resolved, _ = Collapse(()), None
    resolved = resolved.resolve(ctx(), specs_of(differ))
    with pytest.raises(OpError, match="values differ"):
        resolved.forward(differ)
    signed = ((torch.tensor([0.0, -0.0]),),)  # equal as numbers, not bit for bit
    with pytest.raises(OpError, match="values differ"):
        Collapse(()).resolve(ctx(), specs_of(signed)).forward(signed)
    with pytest.raises(OpError, match="one element"):
        Collapse((2,)).resolve(ctx(), specs_of(same))
