"""Block-diagonal ops: join tensors into the diagonal blocks of one, and split them back.

LoRA's fused experts need them: a fused row block ``[W_g; W_u]`` takes the delta
``[B_g A_g; B_u A_u] = blockdiag(B_g, B_u) · [A_g; A_u]``, so the per-expert ``lora_B``
pair becomes one block-diagonal matrix (the rank axis doubles, half of it zeros).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from weightplan.errors import OpError
from weightplan.planner.core.ops.base import ConversionOp, Streams, flat, single_input
from weightplan.planner.core.spec import TensorSpec


@dataclass(frozen=True, repr=False)
class BlockDiagonal(ConversionOp):
    """Put each input (streams in declared order) on the diagonal of one tensor; the
    last two dims are the matrix, leading dims are batch dims (experts) shared by all.

    ``(E, I, r)`` and ``(E, I, r)`` → ``(E, 2I, 2r)``, zeros off the diagonal.
    Inverse: :class:`BlockDiagonalSplit` with the blocks' sizes.
    """

    rows: tuple[int, ...] | None = field(default=None, kw_only=True)
    cols: tuple[int, ...] | None = field(default=None, kw_only=True)

    def resolve(self, ctx, inputs):
        specs = flat(inputs)
        if len(specs) < 2:
            raise OpError(f"{self!r} joins two or more tensors, got {len(specs)}")
        self._check(specs)
        return dataclasses.replace(self, rows=tuple(s.shape[-2] for s in specs),
                                   cols=tuple(s.shape[-1] for s in specs))

    def _check(self, specs: tuple[TensorSpec, ...]) -> None:
        first = specs[0]
        for s in specs:
            if len(s.shape) < 2 or s.shape[:-2] != first.shape[:-2] or s.dtype != first.dtype:
                raise OpError(f"{self!r}: can't put {s} on a diagonal with {first} (same "
                              "leading dims and dtype, at least 2-d)")

    def infer(self, inputs: Streams[TensorSpec]) -> Streams[TensorSpec]:
        specs = flat(inputs)
        self._check(specs)
        shape = (*specs[0].shape[:-2], sum(s.shape[-2] for s in specs),
                 sum(s.shape[-1] for s in specs))
        return ((TensorSpec(shape, specs[0].dtype),),)

    def forward(self, streams):
        blocks = flat(streams)
        first = blocks[0]
        rows, cols = sum(b.shape[-2] for b in blocks), sum(b.shape[-1] for b in blocks)
        out = first.new_zeros((*first.shape[:-2], rows, cols))
        r = c = 0
        for b in blocks:
            out[..., r:r + b.shape[-2], c:c + b.shape[-1]] = b
            r, c = r + b.shape[-2], c + b.shape[-1]
        return ((out,),)

    def inverse(self) -> "BlockDiagonalSplit":
        return BlockDiagonalSplit(rows=self.rows or (), cols=self.cols or ())


@dataclass(frozen=True, repr=False)
class BlockDiagonalSplit(ConversionOp):
    """Take the diagonal blocks of one tensor out, one output stream per block.

    Refuses (:class:`OpError`) when a value off the diagonal is not zero: such a tensor
    (a block-diagonal LoRA B trained after fusion) has no block form, and dropping those
    values would lose them silently. Without sizes, equal blocks, one per target.
    Inverse: :class:`BlockDiagonal`.
    """

    rows: tuple[int, ...] = ()
    cols: tuple[int, ...] = ()

    def resolve(self, ctx, inputs):
        spec = single_input(self, inputs)
        if not self.rows and not self.cols and len(spec.shape) >= 2:
            n, (r, c) = len(ctx.target_keys), spec.shape[-2:]
            if n < 2 or r % n or c % n:
                raise OpError(f"{self!r}: can't split {list(spec.shape)} into {n} equal "
                              f"diagonal blocks for {list(ctx.target_keys)}")
            return dataclasses.replace(self, rows=(r // n,) * n, cols=(c // n,) * n)
        if len(self.rows) != len(self.cols) or len(self.rows) < 2:
            raise OpError(f"{self!r}: rows and cols give one size per block, two or more")
        if len(spec.shape) < 2 or spec.shape[-2:] != (sum(self.rows), sum(self.cols)):
            raise OpError(f"{self!r} expects (..., {sum(self.rows)}, {sum(self.cols)}), got "
                          f"{list(spec.shape)}")
        return self

    def infer(self, inputs: Streams[TensorSpec]) -> Streams[TensorSpec]:
        spec = single_input(self, inputs)
        lead = spec.shape[:-2]
        return tuple((TensorSpec((*lead, r, c), spec.dtype),)
                     for r, c in zip(self.rows, self.cols, strict=True))

    def forward(self, streams):
        (tensor,), = streams
        if not off_diagonal_zero(tensor, self.rows, self.cols):
            raise OpError(f"{self!r}: values off the diagonal blocks are not zero, so the "
                          "tensor has no block form (was it trained after fusion?); keep "
                          "the fused layout")
        out, r, c = [], 0, 0
        for rows, cols in zip(self.rows, self.cols, strict=True):
            out.append((tensor[..., r:r + rows, c:c + cols],))
            r, c = r + rows, c + cols
        return tuple(out)

    def inverse(self) -> BlockDiagonal:
        return BlockDiagonal(rows=self.rows, cols=self.cols)


def off_diagonal_zero(tensor: torch.Tensor, rows: tuple[int, ...], cols: tuple[int, ...]
                      ) -> bool:
    """Whether every value of ``tensor`` outside its diagonal blocks is zero."""
    mask = torch.ones(tensor.shape[-2:], dtype=torch.bool, device=tensor.device)
    r = c = 0
    for rr, cc in zip(rows, cols, strict=True):
        mask[r:r + rr, c:c + cc] = False
        r, c = r + rr, c + cc
    return not bool(tensor[..., mask].any())
