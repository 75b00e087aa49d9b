"""Block-scaled FP8: the scale grid, scale decoding and dequantization, as pure torch.

Three facts define the format (DeepSeek-V3, transformers' fine-grained FP8):

1. A weight ``W[..., R, C]`` is stored as ``q`` (``float8_e4m3fn``) with one scale per
   ``b0 × b1`` block; the grid is the *ceil* grid ``[..., ⌈R/b0⌉, ⌈C/b1⌉]``, so scale row
   ``i`` covers rows ``[i·b0, (i+1)·b0)`` and the last row/column block may be partial.
2. ``W ≈ q.float() · s`` per block (fp32 product, then one rounding to the destination
   dtype). Scales are float32 (``weight_scale_inv``), or e8m0 exponents (``uint8`` /
   ``float8_e8m0fnu``) meaning ``2**(byte − 127)``.
3. A ``None`` block means one scale for the whole matrix (per-tensor).

Dequantization writes into a caller-given destination (any strided view of the right
shape: the slice of a merged parameter) in row chunks aligned to ``b0``, through one
bounded fp32 workspace, never a full-size fp32 temporary.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from functools import lru_cache

import torch

CHUNK_BYTES = 4 << 20  # fp32 workspace per dequantize/quantize call (one per worker)
FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))
E8M0 = getattr(torch, "float8_e8m0fnu", None)
SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.uint8) + ((E8M0,) if E8M0 else ())

Block = tuple[int, ...] | None  # (rows, cols) per scale; None: one scale per tensor


def block_of(shape: tuple[int, ...], block: Block) -> tuple[int, int]:
    """The concrete block for a weight of ``shape`` (``None``: the whole matrix)."""
    if block is None:
        return (max(shape[-2], 1), max(shape[-1], 1))
    return (int(block[0]), int(block[1]))


def scale_grid(shape: tuple[int, ...], block: Block) -> tuple[int, ...]:
    """The ceil grid of scales for a weight of ``shape``: ``[..., ⌈R/b0⌉, ⌈C/b1⌉]``."""
    return _scale_grid(tuple(shape), _block_key(block))


def _block_key(block: Block) -> Block:
    return None if block is None else tuple(block)


@lru_cache(maxsize=4096)
def _scale_grid(shape: tuple[int, ...], block: Block) -> tuple[int, ...]:
    b0, b1 = block_of(shape, block)
    return tuple(shape[:-2]) + (math.ceil(shape[-2] / b0), math.ceil(shape[-1] / b1))


def grid_fits(weight_shape: tuple[int, ...], scale_shape: tuple[int, ...], block: Block) -> bool:
    """Whether a scale of ``scale_shape`` is the grid of ``weight_shape`` (per-tensor
    scales may also be stored as ``[]`` or ``[1]``)."""
    return _grid_fits(tuple(weight_shape), tuple(scale_shape), _block_key(block))


@lru_cache(maxsize=4096)
def _grid_fits(weight_shape: tuple[int, ...], scale_shape: tuple[int, ...], block: Block) -> bool:
    if len(weight_shape) < 2:
        return False
    expected = scale_grid(weight_shape, block)
    if tuple(scale_shape) == expected:
        return True
    return block is None and len(weight_shape) == 2 and tuple(scale_shape) in ((), (1,))


def decode_scales(scales: torch.Tensor) -> torch.Tensor:
    """Scales as float32 multipliers, decoded as transformers decodes them: ``uint8`` bytes
    are e8m0 exponents ``2**(byte − 127)``; every other dtype (``float8_e8m0fnu`` included)
    converts by value."""
    if scales.dtype == torch.uint8:
        return (scales.to(torch.float32) - 127.0).exp2()
    return scales.to(torch.float32)


def rows_per_chunk(shape: tuple[int, ...], block: Block, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows of one workspace chunk: a multiple of ``b0`` (at least one block row), at most
    the matrix's rows."""
    rows, cols = shape[-2], max(shape[-1], 1)
    b0, _ = block_of(shape, block)
    blocks = max(1, chunk_bytes // (4 * cols * b0))
    return max(1, min(rows, blocks * b0))


def workspace_bytes(shape: tuple[int, ...], block: Block, chunk_bytes: int = CHUNK_BYTES,
                    per_element: int = 4) -> int:
    """Bytes of the workspace ``quantize_into`` (fp32: 4 per element) or
    :func:`dequantize_into` (fp32 + int32 table indices: :data:`DEQUANTIZE_BYTES`) hold."""
    return _workspace_bytes(tuple(shape), _block_key(block), chunk_bytes, per_element)


@lru_cache(maxsize=4096)
def _workspace_bytes(shape: tuple[int, ...], block: Block, chunk_bytes: int, per_element: int
                     ) -> int:
    if len(shape) < 2 or 0 in shape:
        return 0
    return per_element * rows_per_chunk(shape, block, chunk_bytes) * shape[-1]


DEQUANTIZE_BYTES = 8  # per workspace element: the fp32 chunk and its int32 table indices


def fp8_table(dtype: torch.dtype) -> torch.Tensor:
    """The 256 values of an 8-bit float dtype as float32, by byte: a table lookup converts
    exactly as ``.float()`` does, several times faster on CPU."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()


def workspace(size: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A dequantize workspace of ``size`` elements: fp32 values and int32 table indices
    (callers that run many dequantizes keep one per thread and pass it as ``buffers``)."""
    return (torch.empty(size, dtype=torch.float32, device=device),
            torch.empty(size, dtype=torch.int32, device=device))


def _widen(dest: torch.Tensor, q: torch.Tensor, table: torch.Tensor | None,
           index: torch.Tensor) -> None:
    """``dest ← q.float()`` (``dest`` a contiguous fp32 chunk)."""
    if table is None:
        dest.copy_(q)
        return
    idx = index[: dest.numel()]
    idx.view(dest.shape).copy_(q.view(torch.uint8))
    torch.index_select(table, 0, idx, out=dest.view(-1))


def matrices(shape: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Every leading index of a ``[..., R, C]`` tensor (``()`` for a matrix)."""
    return itertools.product(*(range(n) for n in shape[:-2]))


def expand_rows(scales: torch.Tensor, b0: int, rows: int, row0: int = 0) -> torch.Tensor:
    """Scale rows repeated over their block rows: the scales of rows ``[row0, row0 + rows)``
    of the weight, ``[rows, nc]`` (small: ``b1`` times smaller than the rows)."""
    first = row0 // b0
    block_rows = scales[first: -(-(row0 + rows) // b0)]
    skip = row0 - first * b0
    return block_rows.repeat_interleave(b0, dim=0)[skip: skip + rows]


def scale_columns_(x: torch.Tensor, srows: torch.Tensor, b1: int, col0: int = 0) -> torch.Tensor:
    """``x[r, c] *= srows[r, (col0 + c) // b1 − col0 // b1]`` in place: columns of ``x``
    are weight columns ``col0 + c``, ``srows`` holds the scale columns from ``col0 // b1``
    on. Each block's columns are a broadcast view of ``x``: scales are never expanded."""
    head = min(-col0 % b1, x.shape[-1])
    if head:
        x[:, :head].mul_(srows[:, :1])
        x, srows = x[:, head:], srows[:, 1:]
    full, rem = divmod(x.shape[-1], b1)
    if full:
        x[:, : full * b1].unflatten(-1, (full, b1)).mul_(srows[:, :full, None])
    if rem:
        x[:, full * b1:].mul_(srows[:, full:full + 1])
    return x


def dequantize_chunks(q: torch.Tensor, scales: torch.Tensor, block: Block,
                      origin: tuple[int, ...] | None = None, *,
                      full_shape: tuple[int, ...] | None = None, chunk_bytes: int = CHUNK_BYTES,
                      buffers: tuple[torch.Tensor, torch.Tensor] | None = None
                      ) -> Iterator[tuple[tuple[int, ...], int, int, torch.Tensor]]:
    """Yield ``(index, r0, r1, x)``: ``x`` (fp32, a reused workspace) is ``q[index][r0:r1]``
    dequantized. ``q`` may be a region of a larger weight (``full_shape``) starting at
    ``origin``; ``scales`` is the whole weight's grid. Copy ``x`` before the next step."""
    shape = tuple(q.shape)
    full_shape = tuple(full_shape or shape)
    origin = tuple(origin or (0,) * len(shape))
    if q.numel() == 0:
        return
    s = decode_scales(scales).reshape(scale_grid(full_shape, block))
    b0, b1 = block_of(full_shape, block)
    lead0, (row0, col0) = origin[:-2], origin[-2:]
    cols = shape[-1]
    size = rows_per_chunk(shape, block, chunk_bytes) * cols
    work, index = buffers if buffers is not None else workspace(size, q.device)
    work, index = work[:size], index[:size]
    table = fp8_table(q.dtype) if q.dtype.itemsize == 1 and q.dtype.is_floating_point \
        and q.device.type == "cpu" else None  # (the table is the CPU's fast path)
    step = work.numel() // cols
    for idx in matrices(shape):
        s_mat = s[tuple(a + i for a, i in zip(lead0, idx, strict=True))][:, col0 // b1: -(-(col0 + cols) // b1)]
        for r0 in range(0, shape[-2], step):
            r1 = min(shape[-2], r0 + step)
            x = work[: (r1 - r0) * cols].view(r1 - r0, cols)
            _widen(x, q[idx][r0:r1], table, index)
            scale_columns_(x, expand_rows(s_mat, b0, r1 - r0, row0 + r0), b1, col0)
            yield idx, r0, r1, x


def dequantize_into(q: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, block: Block,
                    *, origin: tuple[int, ...] | None = None,
                    full_shape: tuple[int, ...] | None = None,
                    chunk_bytes: int = CHUNK_BYTES) -> torch.Tensor:
    """``out ← (q.float() · s)`` per block, cast to ``out.dtype``; returns ``out``.

    ``q`` is ``[..., R, C]`` FP8 (or a region of a ``full_shape`` weight at ``origin``),
    ``scales`` the weight's ceil grid (or one per-tensor value when ``block`` is ``None``),
    ``out`` any floating view of ``q``'s shape (for example the slice of a merged
    parameter). Work happens in row chunks through one fp32 workspace of
    :func:`workspace_bytes`.
    """
    if tuple(out.shape) != tuple(q.shape):
        raise ValueError(f"destination {list(out.shape)} != weight {list(q.shape)}")
    for idx, r0, r1, x in dequantize_chunks(q, scales, block, origin, full_shape=full_shape,
                                             chunk_bytes=chunk_bytes):
        out[idx][r0:r1].copy_(x)
    return out


def dequantize(q: torch.Tensor, scales: torch.Tensor, block: Block,
               dtype: torch.dtype = torch.bfloat16, *, chunk_bytes: int = CHUNK_BYTES
               ) -> torch.Tensor:
    """A new ``dtype`` tensor: :func:`dequantize_into` a fresh destination."""
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    return dequantize_into(q, scales, out, block, chunk_bytes=chunk_bytes)
