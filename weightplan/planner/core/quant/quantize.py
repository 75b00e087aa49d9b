"""Block FP8 quantization, bit for bit transformers' ``Fp8Quantize`` formula.

Per ``b0 × b1`` tile: ``amax = max|w|`` (in fp32), ``scale = 448 / amax`` (1 where
``amax`` is 0), ``q = clamp(w · scale, ±448)`` to ``float8_e4m3fn``, stored
``s = 1 / scale`` (float32). With ``scale_fmt="ue8m0"`` the stored inverse is rounded up
to a power of two (``float8_e8m0fnu``) and ``scale`` is its exact reciprocal.

``scale_fmt="exact"`` re-encodes values already on a coarser grid (MXFP4's E2M1 · 2^e)
losslessly: each tile's stored inverse is the power of two ``2^k``, ``k = ⌈log2(amax /
448)⌉`` (float32; the smallest that keeps the tile in range, so its small values keep the
most room), ``q = w · 2^−k`` (float64: no overflow for tiny scales), and every element is
checked to come back exactly (``q · 2^k == w``); a tile that can't (its values span more
binades than E4M3 holds) raises :class:`QuantizationError` naming the tile.

transformers quantizes only weights whose dims are multiples of the block; here a partial
edge tile is the zero-padded tile: its ``amax`` is the ``amax`` of its real elements (zeros
never raise it), so cropping the padded result gives exactly what is written. The
arithmetic is spelled as transformers spells it (``448.0 / t`` and ``1.0 / t`` are
``reciprocal · scalar`` in torch, not a true division), which is what makes it bit-exact.
"""

from __future__ import annotations

import torch

from weightplan.errors import QuantizationError
from weightplan.planner.core.quant.blocks import (
    CHUNK_BYTES, E8M0, Block, block_of, expand_rows, matrices, rows_per_chunk, scale_columns_,
    scale_grid,
)

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
SCALE_FORMATS = ("float", "ue8m0", "exact")


def scale_dtype(scale_fmt: str) -> torch.dtype:
    """The stored dtype of ``weight_scale_inv`` for a ``scale_fmt``."""
    if scale_fmt == "ue8m0":
        if E8M0 is None:
            raise ValueError("scale_fmt='ue8m0' needs torch.float8_e8m0fnu (torch >= 2.7)")
        return E8M0
    if scale_fmt not in ("float", "exact"):
        raise ValueError(f"scale_fmt must be one of {SCALE_FORMATS}, not {scale_fmt!r}")
    return torch.float32


def quantize(w: torch.Tensor, block: Block = (128, 128), *, scale_fmt: str = "float",
             chunk_bytes: int = CHUNK_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)`` for a floating ``[..., R, C]`` weight: fresh tensors, see
    :func:`quantize_into`."""
    q = torch.empty(w.shape, dtype=FP8, device=w.device)
    s = torch.empty(scale_grid(tuple(w.shape), block), dtype=scale_dtype(scale_fmt),
                    device=w.device)
    return quantize_into(w, q, s, block, scale_fmt=scale_fmt, chunk_bytes=chunk_bytes)


def quantize_into(w: torch.Tensor, q_out: torch.Tensor, s_out: torch.Tensor, block: Block,
                  *, scale_fmt: str = "float", chunk_bytes: int = CHUNK_BYTES
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``w`` into ``q_out`` (FP8, ``w``'s shape) and ``s_out`` (the ceil grid).

    Works in row chunks aligned to ``b0`` through one fp32 workspace; both outputs may be
    strided views (slices of merged parameters).
    """
    shape = tuple(w.shape)
    if tuple(q_out.shape) != shape or tuple(s_out.shape) != scale_grid(shape, block):
        raise ValueError(f"outputs {list(q_out.shape)}/{list(s_out.shape)} don't fit weight "
                         f"{list(shape)} with block {block}")
    if w.numel() == 0:
        return q_out, s_out
    work = torch.empty(rows_per_chunk(shape, block, chunk_bytes) * shape[-1],
                       dtype=torch.float32, device=w.device)
    b = block_of(shape, block)
    for idx in matrices(shape):
        _quantize_matrix(w[idx], q_out[idx], s_out[idx], b, work, scale_fmt, idx)
    return q_out, s_out


def _quantize_matrix(w: torch.Tensor, q_out: torch.Tensor, s_out: torch.Tensor,
                     block: tuple[int, int], work: torch.Tensor, scale_fmt: str,
                     lead: tuple[int, ...]) -> None:
    """Quantize matrix ``lead`` of the weight (its leading index: ``()`` for a matrix)."""
    rows, cols = w.shape
    b0, b1 = block
    step = work.numel() // cols
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        x = work[: (r1 - r0) * cols].view(r1 - r0, cols)
        x.copy_(w[r0:r1])
        if scale_fmt == "exact":
            q_out[r0:r1].copy_(_exact_rows(x, s_out, r0, b0, b1, lead))
            continue
        scales, inv = tile_scales(tile_amax(x, b0, b1), scale_fmt)
        scale_columns_(x, expand_rows(scales, b0, r1 - r0), b1)
        q_out[r0:r1].copy_(x.clamp_(min=-FP8_MAX, max=FP8_MAX))
        s_out[r0 // b0: -(-r1 // b0)].copy_(inv)


def tile_amax(x: torch.Tensor, b0: int, b1: int) -> torch.Tensor:
    """``max|x|`` per ``b0 × b1`` tile of a ``[r, C]`` fp32 matrix → ``[⌈r/b0⌉, ⌈C/b1⌉]``
    (max and −min per tile: exact, and no second chunk-sized buffer for ``|x|``)."""
    rows, cols = x.shape
    full, rem = divmod(cols, b1)
    parts = []
    if full:
        tiles = x[:, : full * b1].unflatten(-1, (full, b1))
        parts.append(torch.maximum(tiles.amax(-1), tiles.amin(-1).neg()))
    if rem:
        tail = x[:, full * b1:]
        parts.append(torch.maximum(tail.amax(-1, keepdim=True), tail.amin(-1, keepdim=True).neg()))
    per_row = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    pad = -rows % b0
    if pad:
        per_row = torch.cat([per_row, per_row.new_zeros(pad, per_row.shape[1])])
    return per_row.view(-1, b0, per_row.shape[1]).amax(1)


def tile_scales(amax: torch.Tensor, scale_fmt: str = "float") -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, stored inverse)`` per tile from its ``amax``, as transformers computes them."""
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    scales = FP8_MAX / safe
    scales = torch.where(amax > 0, scales, torch.ones_like(scales))
    inv = (1.0 / scales).to(torch.float32)
    if scale_fmt == "ue8m0":
        inv = torch.pow(2.0, torch.ceil(torch.log2(inv.clamp(min=torch.finfo(torch.float32).tiny))))
        inv = inv.to(scale_dtype("ue8m0"))
        scales = 1.0 / inv.to(torch.float32)
    return scales, inv


def _exact_rows(x: torch.Tensor, s_out: torch.Tensor, r0: int, b0: int, b1: int,
                lead: tuple[int, ...]) -> torch.Tensor:
    """FP8 of rows ``x`` (weight rows from ``r0``, whole tiles of ``b0`` rows unless the
    last), their tiles' power-of-two inverses written into ``s_out`` (see the module
    docstring: ``exact``). ``lead``: the matrix's leading index (an expert's), named
    before the tile's in a refusal."""
    amax = tile_amax(x, b0, b1).to(torch.float64)
    k = torch.where(amax > 0, torch.ceil(torch.log2(amax / FP8_MAX)), torch.zeros_like(amax))
    k = k + (amax * torch.exp2(-k) > FP8_MAX)  # (log2's rounding, never below range)
    rows = x.shape[0]
    up = expand_rows(torch.exp2(-k), b0, rows).repeat_interleave(b1, dim=1)[:, : x.shape[1]]
    wide = x.to(torch.float64)
    q = (wide * up).to(FP8)
    bad = (q.to(torch.float64) / up != wide).nonzero()
    if len(bad):
        r, c = (int(v) for v in bad[0])
        tile = ", ".join(map(str, (*lead, (r0 + r) // b0, c // b1)))
        raise QuantizationError(
            f"block ({tile}) can't be re-encoded exactly: {wide[r, c].item()!r} "
            f"needs more range than E4M3 holds under the block's scale 2^{int(k[r // b0, c // b1])} "
            "(its values span too many binades)")
    s_out[r0 // b0: -(-(r0 + rows) // b0)].copy_(torch.exp2(k).to(torch.float32))
    return q
