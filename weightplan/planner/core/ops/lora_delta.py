"""``W += s·B·A`` for :class:`~.merge.MergeLora`, cut into independent pieces.

Each piece is a run of one expert's rows over one span of the rank (:func:`rank_segments`),
``PIECE_ELEMENTS`` of the weight at most; it computes its delta a block of rows at a time
in a pair of float32 buffers (float64 for a float64 weight; the delta, the base rows
widened: a cache's worth, so the block stays in cache between its matmul and its rounding;
a pair per piece running at once, taken from the merge's pairs and given back) and rounds
each block once into the weight's dtype. Pieces write disjoint elements: the caller may run them in any
order, on any threads at once (the executor: on its pool, whose threads each hold torch at
one intra-op thread, :mod:`weightplan.executor.intra_op`); ``forward`` runs them in turn.

Exactness (the oracle: ``(W.float() + (B @ A) * s).to(W.dtype)``): every element's delta is
the same rank-long dot product as in the whole ``B @ A`` (a zero half of a block-diagonal
B adds exact zeros), then multiplied by ``s`` and added to the widened base as two
roundings (``s = 1``: one, no multiply), then cast once. Not fused: a multiply-add rounds
once and differs, and ``addmm`` into the widened block (``beta = 1``) differs even where
``s`` is a power of two (MKL's small-matrix kernels accumulate into it).
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from functools import partial

import torch

CHUNK_ELEMENTS = 1 << 19  # float32 elements of each of the two block buffers (2 MiB),
# shared among the pieces that run at once: each piece's are this over ``workers`` (2
# workers: 256 rows of 1024, 160 of 1536; L3-sized, the GEMM's rows long enough: in a load,
# 12% less CPU than half of it, the same as twice)
PIECE_ELEMENTS = 1 << 21  # a piece: this many elements of the weight at most (a few ms)
ROW_ALIGN = 16  # block rows start on multiples of this (see _aligned)
MAX_SEGMENTS = 64  # past this many row runs, one matmul over the whole rank is cheaper

Piece = Callable[[], None]


def delta_pieces(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float,
                 transposed: bool, workers: int) -> list[Piece]:
    """The pieces adding ``scale·B_e·A_e`` into ``out[e]`` for every expert ``e`` (``out``
    ``(E, out, in)``, or ``(E, in, out)`` ``transposed``; ``a`` ``(E, r, in)``, ``b``
    ``(E, out, r)``, float32 or float64, on ``out``'s device: the sum is formed in their
    dtype); ``workers``: how many run at once (they
    share ``CHUNK_ELEMENTS``, at least one row each)."""
    width = max(1, out.shape[-1])
    rows = _aligned(CHUNK_ELEMENTS // max(1, workers) // width - (ROW_ALIGN - 1))
    span = max(1, PIECE_ELEMENTS // max(1, width) // rows) * rows
    segments = [(0, out.shape[1], 0, b.shape[2])] if transposed else rank_segments(b)
    cuts = [(e, (start, stop, k0, k1)) for e in range(len(out))
            for first, last, k0, k1 in segments for start, stop in runs(first, last, span)]
    count = min(rows + ROW_ALIGN - 1, max((cut[1] - cut[0] for _, cut in cuts), default=0)
                ) * width  # (a block and a short tail)
    pairs = max(1, min(workers, len(cuts), CHUNK_ELEMENTS // max(1, count)))  # (planned:
    buffers: queue.SimpleQueue = queue.SimpleQueue()  # block_elements; a pair per piece
    for _ in range(pairs):  # running at once, reused: no fresh pages per piece)
        buffers.put(tuple(torch.empty(count, dtype=a.dtype, device=out.device)
                          for _ in range(2)))
    return [partial(_piece, out[e], b[e], a[e], scale, transposed, cut, rows, buffers)
            for e, cut in cuts]


def _aligned(rows: int) -> int:
    """A block's rows: a multiple of ``ROW_ALIGN``, at least ``ROW_ALIGN`` whatever the
    workers (MKL's GEMM sums a row in the same order as the whole ``B @ A`` does when the
    block starts on its row tiling; blocks of 1-3 rows take its matrix-vector kernels,
    which sum in another order: 67 of 32×28672 bf16 elements differed at 4 workers); a
    tail shorter than ``ROW_ALIGN`` joins the block before it (35 rows as 16 + 16 + 3:
    2 of 35×28672 differed; as 16 + 19: none)."""
    return max(ROW_ALIGN, rows - rows % ROW_ALIGN)


def runs(start: int, stop: int, step: int) -> list[tuple[int, int]]:
    """``[start, stop)`` in runs of ``step`` rows, a last one shorter than ``ROW_ALIGN``
    joined to the run before it (see :func:`_aligned`)."""
    bounds = list(range(start, stop, step))
    if len(bounds) > 1 and stop - bounds[-1] < ROW_ALIGN:
        del bounds[-1]
    return list(zip(bounds, [*bounds[1:], stop], strict=True))


def block_elements(shape: tuple[int, ...] | torch.Size) -> int:
    """The float32 elements of each of the two block buffers of :func:`delta_pieces`, all
    the pieces running at once together: ``CHUNK_ELEMENTS``, or a block of ``ROW_ALIGN``
    rows and a short tail of a wider weight, at most the weight."""
    numel = 1
    for n in shape:
        numel *= n
    return min(numel, max(CHUNK_ELEMENTS, (2 * ROW_ALIGN - 1) * (shape[-1] if shape else 1)))


def _piece(out: torch.Tensor, b: torch.Tensor, a: torch.Tensor, scale: float,
           transposed: bool, segment: tuple[int, int, int, int], rows: int,
           buffers: queue.SimpleQueue) -> None:
    """Rows ``[start, stop)`` of ``out = W + (B·A)·scale`` over the rank span ``[k0, k1)``
    (transposed: rows of ``((B·A)·scale)ᵀ``, the whole rank), ``rows`` at a time."""
    pair = buffers.get()
    try:
        _blocks(out, b, a, scale, transposed, segment, rows, *pair)
    finally:
        buffers.put(pair)


def _blocks(out: torch.Tensor, b: torch.Tensor, a: torch.Tensor, scale: float,
            transposed: bool, segment: tuple[int, int, int, int], rows: int,
            delta: torch.Tensor, wide: torch.Tensor) -> None:
    start, stop, k0, k1 = segment
    width = out.shape[-1]
    for first, last in runs(start, stop, rows):
        block = out[first:last]
        if transposed:
            d = delta[:block.numel()].view(width, last - first)
            torch.matmul(b, a[:, first:last], out=d)
            d = d.T
        else:
            d = delta[:block.numel()].view(last - first, width)
            torch.matmul(b[first:last, k0:k1], a[k0:k1], out=d)
        w = wide[:block.numel()].view(block.shape)
        w.copy_(block)
        w.add_(d if scale == 1 else d.mul_(scale))  # (·1 changes nothing: not a pass)
        block.copy_(w)


def rank_segments(b: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """Runs of ``B``'s rows with the same span of non-zero columns, ``(first row, stop,
    first column, stop)``, over every expert at once (``B`` ``(E, out, r)``: a row's span
    covers each expert's): a fused pair's block-diagonal B multiplies only its own half of
    A (the zero half adds exact zeros; skipping it halves the work). Rows without a non-zero
    take the whole rank; too many runs (no block structure): one run over all of it."""
    nonzero = b != 0
    if nonzero.dim() == 3:
        nonzero = nonzero.any(0)
    n, k = nonzero.shape
    if n == 0 or k == 0 or bool(nonzero.all()):
        return [(0, n, 0, k)]
    some = nonzero.any(1)
    lo = torch.where(some, nonzero.int().argmax(1), 0)
    hi = torch.where(some, k - nonzero.flip(1).int().argmax(1), k)
    key = lo * (k + 1) + hi
    cuts = (torch.nonzero(key[1:] != key[:-1]).flatten() + 1).tolist()
    if len(cuts) >= MAX_SEGMENTS:
        return [(0, n, 0, k)]
    bounds = [0, *cuts, n]
    return [(s, e, int(lo[s]), int(hi[s])) for s, e in zip(bounds, bounds[1:], strict=False)]
