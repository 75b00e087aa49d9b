"""``MergeLora`` over random fused-expert shapes: the merged tensor equals, expert by
expert, ``W + s·B·A`` computed in float32 and rounded once, whether the base inputs are
copied into their place (the base chain places) or the chain runs on tensors, and whether
B is block-diagonal (each half of A multiplied by its own rows only) or dense, and whether
the op runs whole (``forward``) or as ``update``'s pieces on several threads in any order."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weightplan.planner.core.ops import lora_delta
from weightplan.planner.core.ops.base import OpContext
from weightplan.planner.core.ops.joins import Concatenate, MergeModulelist
from weightplan.planner.core.ops.merge import MergeLora
from weightplan.planner.core.spec import TensorSpec

BF16 = torch.bfloat16


def _fused_factors(g: torch.Generator, e: int, r: int, inter: int, hidden: int, dense: bool):
    """peft's packing of a fused gate/up adapter: A (E·2r, H) expert-slowest, B (2I, 2r·E)
    expert-fastest, each expert's B block-diagonal (gate rows on its first r columns) or
    ``dense`` (trained after fusion), a zero row in either."""
    a = torch.randn(e, 2 * r, hidden, generator=g)
    b = torch.randn(2 * inter, 2 * r, e, generator=g)
    if not dense:
        b[:inter, r:] = 0
        b[inter:, :r] = 0
    b[inter - 1] = 0
    return a.reshape(e * 2 * r, hidden), b.reshape(2 * inter, 2 * r * e)


@settings(max_examples=25, deadline=None)
@given(e=st.integers(2, 4), r=st.integers(1, 6), inter=st.integers(1, 40),
       hidden=st.integers(1, 40), scale=st.sampled_from([0.5, 1.0, 2.0, 1.7, 3 / 4 ** 0.5]),
       dense=st.booleans(), seed=st.integers(0, 2**16))
def test_fused_merge_is_w_plus_sba_rounded_once(e, r, inter, hidden, scale, dense, seed):
    g = torch.Generator().manual_seed(seed)
    gate = [torch.randn(inter, hidden, generator=g).to(BF16) for _ in range(e)]
    up = [torch.randn(inter, hidden, generator=g).to(BF16) for _ in range(e)]
    a, b = _fused_factors(g, e, r, inter, hidden, dense)
    streams = (tuple(gate), tuple(up), (a,), (b,))
    specs = tuple(tuple(TensorSpec.of(t) for t in s) for s in streams)
    keys = tuple(tuple(f"k{i}.{j}" for j in range(len(s))) for i, s in enumerate(streams))
    op = MergeLora(scale, (2, 1, 1), (MergeModulelist(dim=0), Concatenate(dim=1)),
                   experts=e)
    op = op.resolve(OpContext(("w",), (None,), keys), specs)
    assert op.placed is not None  # (stack and concatenate place)
    merged = op.forward(streams)[0][0]
    assert torch.equal(dataclasses.replace(op, placed=None).forward(streams)[0][0], merged)
    assert torch.equal(_pieces_on_threads(op, torch.cat([torch.stack(gate), torch.stack(up)],
                                                        dim=1), (a,), (b,),
                                          ((None,) * e, (None,) * e)), merged)
    packed_b = b.reshape(2 * inter, 2 * r, e)
    for x in range(e):
        w = torch.cat([gate[x], up[x]]).float()
        a_x, b_x = a.reshape(e, 2 * r, hidden)[x], packed_b[:, :, x]
        want = (w + _product(b_x, a_x, r, inter, dense) * scale).to(BF16)
        assert torch.equal(merged[x], want), x


def _product(b: torch.Tensor, a: torch.Tensor, r: int, inter: int, dense: bool) -> torch.Tensor:
    """``B·A`` in float32 as the merge states it: a block-diagonal B's gate rows sum over
    A's gate half only, its up rows over the up half (the other half's terms are exact
    zeros, but a GEMM over all 2r columns may sum the non-zero terms in another order, and
    float32 addition is not associative: 1 ulp apart, seen once in ~100 examples)."""
    if dense:
        return b @ a
    return torch.cat([b[:inter, :r] @ a[:r], b[inter:, r:] @ a[r:]])


def _pieces_on_threads(op: MergeLora, base: torch.Tensor, a: tuple, b: tuple,
                       placed: tuple) -> torch.Tensor:
    """``op.update``'s pieces on ``base`` (read in place), cut small (blocks of 16 rows,
    pieces of 32), run in reverse order on three threads at once."""
    saved = lora_delta.PIECE_ELEMENTS, lora_delta.CHUNK_ELEMENTS
    width = base.shape[-1]
    lora_delta.PIECE_ELEMENTS, lora_delta.CHUNK_ELEMENTS = 32 * width, 3 * 16 * width
    try:
        pieces = op.update(((base,),), (*placed, a, b), workers=3)
    finally:
        lora_delta.PIECE_ELEMENTS, lora_delta.CHUNK_ELEMENTS = saved
    with ThreadPoolExecutor(3) as pool:
        for done in [pool.submit(piece) for piece in reversed(pieces)]:
            done.result()
    return base


@settings(max_examples=15, deadline=None)
@given(r=st.integers(1, 6), fan_in=st.integers(1, 40), fan_out=st.integers(1, 40),
       seed=st.integers(0, 2**16))
def test_transposed_merge_is_the_delta_transposed(r, fan_in, fan_out, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(fan_in, fan_out, generator=g).to(BF16)  # (in, out): fan_in_fan_out
    a = torch.randn(r, fan_in, generator=g)
    b = torch.randn(fan_out, r, generator=g)
    streams, kept = ((w,), (a,), (b,)), w.clone()
    specs = tuple(tuple(TensorSpec.of(t) for t in s) for s in streams)
    keys = (("w",), ("a",), ("b",))
    op = MergeLora(1.5, (1, 1, 1), transposed=True).resolve(OpContext(("w",), (None,), keys),
                                                             specs)
    merged = op.forward(streams)[0][0]
    assert torch.equal(merged, (w.float() + ((b @ a) * 1.5).T).to(BF16))
    assert torch.equal(w, kept)  # (a read buffer, not the op's to change)
    assert torch.equal(_pieces_on_threads(op, w.clone(), (a,), (b,), ((None,),)), merged)


def test_rank_segments_fall_back_to_the_whole_rank():
    from weightplan.planner.core.ops.lora_delta import MAX_SEGMENTS, rank_segments as _rank_segments

    b = torch.zeros(6, 4)
    b[:3, :2], b[3:, 2:] = 1, 1
    assert _rank_segments(b) == [(0, 3, 0, 2), (3, 6, 2, 4)]
    stripes = torch.zeros(2 * MAX_SEGMENTS, 2)
    stripes[::2, 0], stripes[1::2, 1] = 1, 1
    assert _rank_segments(stripes) == [(0, 2 * MAX_SEGMENTS, 0, 2)]


def test_rank_segments_cover_every_experts_span():
    from weightplan.planner.core.ops.lora_delta import rank_segments as _rank_segments

    b = torch.zeros(2, 6, 4)  # (E, out, r): expert 1's lower rows reach one column further
    b[:, :3, :2], b[:, 3:, 2:] = 1, 1
    b[1, 4, 1] = 1
    assert _rank_segments(b) == [(0, 3, 0, 2), (3, 4, 2, 4), (4, 5, 1, 4), (5, 6, 2, 4)]
    assert _rank_segments(b[:1]) == [(0, 3, 0, 2), (3, 6, 2, 4)]


def test_a_merge_leaves_torchs_thread_count_as_it_was():
    threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    w, a, b = torch.randn(8, 8).to(BF16), torch.randn(2, 8, generator=g), torch.randn(8, 2)
    streams = ((w,), (a,), (b,))
    specs = tuple(tuple(TensorSpec.of(t) for t in s) for s in streams)
    op = MergeLora(2.0, (1, 1, 1)).resolve(OpContext(("w",), (None,), (("w",), ("a",), ("b",))),
                                           specs)
    torch.set_num_threads(max(2, threads))
    try:
        merged = op.forward(streams)[0][0]
        assert torch.get_num_threads() == max(2, threads)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(merged, (w.float() + (b @ a) * 2.0).to(BF16))


@pytest.mark.parametrize("out_f, in_f", [(32, 28672), (35, 28672), (4099, 512), (67, 4096)])
def test_wide_weights_merge_exactly_at_any_worker_count(out_f, in_f):
    """A down_proj as wide as Llama-70B's (28,672), and odd row counts, merged as the
    executor runs it (the pieces on threads holding torch at one intra-op thread,
    ``workers`` = the plan's threads), no constant patched: blocks of at least
    ``ROW_ALIGN`` rows whatever the workers, a short tail joined to the block before it
    (1-3 row blocks take MKL's matrix-vector kernels: 67 elements of 32×28672 differed at
    4 workers, 2 of 35×28672 at any), the buffers within the planned ``block_elements``."""
    g = torch.Generator().manual_seed(0)
    r, s = 16, 2.0
    w = torch.randn(out_f, in_f, generator=g).to(torch.bfloat16)
    a, b = torch.randn(r, in_f, generator=g), torch.randn(out_f, r, generator=g)
    streams = ((w,), (a,), (b,))
    specs = tuple(tuple(TensorSpec.of(t) for t in part) for part in streams)
    op = MergeLora(s, (1, 1, 1)).resolve(OpContext(("w",), (None,), (("w",), ("a",), ("b",))),
                                         specs)
    want = (w.float() + (b @ a) * s).to(torch.bfloat16)
    made = []
    real_empty = torch.empty

    def counted_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        made.append(t.numel())
        return t

    for workers in (4, 8, 16, 1):
        base, made[:] = w.clone(), []
        torch_empty, lora_delta.torch.empty = lora_delta.torch.empty, counted_empty
        try:
            pieces = op.update(((base,),), (None, (a,), (b,)), workers)
        finally:
            lora_delta.torch.empty = torch_empty
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(_one_thread_call, pieces))
        assert torch.equal(base, want), workers
        assert sum(made) <= 2 * lora_delta.block_elements(w.shape), (workers, made)


def _one_thread_call(piece):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        piece()
    finally:
        torch.set_num_threads(before)
