"""Ops that rearrange one tensor at a time: Transpose, PermuteForRope, Conv3d <-> Linear."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from weightplan.errors import OpError
from weightplan.planner.core.geometry import Fragment, Region
from weightplan.planner.core.ops.base import OpContext, Streams, TensorwiseOp, normalize_dim
from weightplan.planner.core.spec import TensorSpec


@dataclass(frozen=True, repr=False)
class Transpose(TensorwiseOp):
    """Swap two dims of every tensor. Inverse: ``Transpose(dim1, dim0)``."""

    allocates = False

    dim0: int = 0
    dim1: int = 1

    def resolve(self, ctx, inputs):
        for stream in inputs:
            for spec in stream:
                normalize_dim(self, self.dim0, len(spec.shape))
                normalize_dim(self, self.dim1, len(spec.shape))
        return self

    def forward_one(self, tensor, stream):
        return tensor.transpose(self.dim0, self.dim1)

    def infer_one(self, spec, stream):
        shape = list(spec.shape)
        a = normalize_dim(self, self.dim0, len(shape))
        b = normalize_dim(self, self.dim1, len(shape))
        shape[a], shape[b] = shape[b], shape[a]
        return TensorSpec(tuple(shape), spec.dtype)

    def place_one(self, fragment, spec, stream):
        if not fragment.aligned:
            return None
        a = normalize_dim(self, self.dim0, len(spec.shape))
        b = normalize_dim(self, self.dim1, len(spec.shape))
        return Fragment(fragment.region.swap(a, b), fragment.target, fragment.view.transpose(a, b))

    def inverse(self) -> "Transpose":
        return Transpose(self.dim1, self.dim0)


@dataclass(frozen=True, repr=False)
class PermuteForRope(TensorwiseOp):
    """Interleaved RoPE rows → half-split rows, within each head (``reverse=True`` undoes it).

    The head count is per tensor: ``rows // head_dim``, so q (attention heads) and k
    (key/value heads) of a GQA model are both right. ``head_dim`` defaults to the model
    config's ``head_dim`` (or ``hidden_size // num_attention_heads``); ``config_key``
    picks a sub-config such as ``"vision_config"``. With ``names``, only source keys
    containing one of them are permuted; others pass through.
    """

    head_dim: int | None = None
    names: tuple[str, ...] | None = field(default=None, kw_only=True)
    config_key: str | None = field(default=None, kw_only=True)
    reverse: bool = field(default=False, kw_only=True)
    mask: tuple[bool, ...] | None = field(default=None, kw_only=True)  # resolved: per stream

    def resolve(self, ctx: OpContext, inputs: Streams[TensorSpec]) -> "PermuteForRope":
        head_dim = self.head_dim or _config_head_dim(ctx.config, self.config_key)
        if not head_dim or head_dim % 2:
            raise OpError(f"{self!r} needs an even head_dim: pass PermuteForRope(head_dim=...) "
                          "or plan with a model whose config has head_dim (or hidden_size and "
                          "num_attention_heads)")
        mask = self.mask if self.mask is not None else tuple(  # kept when inverting a plan
            self.names is None or any(n in k for n in self.names for k in keys)
            for keys in _stream_keys(self, ctx, inputs))
        for permuted, stream in zip(mask, inputs, strict=True):
            for spec in stream if permuted else ():
                if not spec.shape or spec.shape[0] % head_dim:
                    raise OpError(f"{self!r}: {list(spec.shape)} rows are not a multiple of "
                                  f"head_dim {head_dim}")
        return dataclasses.replace(self, head_dim=head_dim, mask=mask)

    def _split(self, rows: int) -> tuple[int, int, int]:
        if self.head_dim is None:
            raise OpError(f"{self!r} is not resolved: plan it (or pass head_dim=...) first")
        heads, half = rows // self.head_dim, self.head_dim // 2
        return (heads, 2, half) if self.reverse else (heads, half, 2)

    def infer_one(self, spec, stream):
        return spec

    def forward_one(self, tensor, stream):
        if self.mask is not None and not self.mask[stream]:
            return tensor
        rows, rest = tensor.shape[0], tuple(tensor.shape[1:])
        return tensor.reshape(*self._split(rows), *rest).transpose(1, 2).reshape(rows, *rest)

    def place_one(self, fragment, spec, stream):
        if self.mask is not None and not self.mask[stream]:
            return fragment
        if not fragment.aligned or not fragment.region.is_full(spec.shape):
            return None
        heads, a, b = self._split(spec.shape[0])
        out_view = fragment.view.split(0, (heads, b, a)).transpose(1, 2)
        return Fragment(fragment.region, fragment.target, out_view)

    def inverse(self) -> "PermuteForRope":
        return dataclasses.replace(self, reverse=not self.reverse)


def _stream_keys(op: PermuteForRope, ctx: OpContext, inputs: Streams[TensorSpec]
                 ) -> tuple[tuple[str, ...], ...]:
    """Keys naming each stream: the sources before a split/join, the targets after."""
    if op.names is None or len(ctx.source_keys) == len(inputs):
        return ctx.source_keys if len(ctx.source_keys) == len(inputs) else tuple(() for _ in inputs)
    if len(ctx.target_keys) == len(inputs):
        return tuple((k,) for k in ctx.target_keys)
    raise OpError(f"{op!r}: can't tell which of {len(inputs)} streams the names refer to")


def _config_head_dim(config: object | None, key: str | None) -> int | None:
    if config is None:
        return None
    cfg = getattr(config, key, None) if key else config
    if cfg is None:
        return None
    head_dim = getattr(cfg, "head_dim", None)
    if head_dim:
        return int(head_dim)
    hidden, heads = getattr(cfg, "hidden_size", None), getattr(cfg, "num_attention_heads", None)
    return hidden // heads if hidden and heads else None


def _kernel(kernel_size: int | tuple[int, ...]) -> tuple[int, int, int]:
    k = (kernel_size,) * 3 if isinstance(kernel_size, int) else tuple(kernel_size)
    if len(k) != 3:
        raise OpError(f"kernel_size must be an int or 3 ints, got {kernel_size!r}")
    return k


@dataclass(frozen=True, repr=False)
class Conv3dToLinear(TensorwiseOp):
    """``(out, in, kt, kh, kw)`` → ``(out, in·kt·kh·kw)``. Inverse: :class:`LinearToConv3d`."""

    in_channels: int
    kernel_size: int | tuple[int, ...]

    def resolve(self, ctx, inputs):
        want = (self.in_channels, *_kernel(self.kernel_size))
        for stream in inputs:
            for spec in stream:
                if len(spec.shape) != 5 or spec.shape[1:] != want:
                    raise OpError(f"{self!r} expects (out, {', '.join(map(str, want))}), "
                                  f"got {list(spec.shape)}")
        return self

    def forward_one(self, tensor, stream):
        return tensor.reshape(tensor.shape[0], -1)

    def infer_one(self, spec, stream):
        return TensorSpec((spec.shape[0], math.prod(spec.shape[1:])), spec.dtype)

    def place_one(self, fragment, spec, stream):
        out_shape = (spec.shape[0], math.prod(spec.shape[1:]))
        return _place_reshape(fragment, spec, out_shape)

    def inverse(self) -> "LinearToConv3d":
        return LinearToConv3d(self.in_channels, self.kernel_size)


@dataclass(frozen=True, repr=False)
class LinearToConv3d(TensorwiseOp):
    """``(out, in·kt·kh·kw)`` → ``(out, in, kt, kh, kw)``. Inverse: :class:`Conv3dToLinear`."""

    in_channels: int
    kernel_size: int | tuple[int, ...]

    def resolve(self, ctx, inputs):
        k = math.prod(_kernel(self.kernel_size)) * self.in_channels
        for stream in inputs:
            for spec in stream:
                if len(spec.shape) != 2 or spec.shape[1] != k:
                    raise OpError(f"{self!r} expects (out, {k}), got {list(spec.shape)}")
        return self

    def forward_one(self, tensor, stream):
        return tensor.reshape(tensor.shape[0], self.in_channels, *_kernel(self.kernel_size))

    def infer_one(self, spec, stream):
        return TensorSpec((spec.shape[0], self.in_channels, *_kernel(self.kernel_size)), spec.dtype)

    def place_one(self, fragment, spec, stream):
        out_shape = (spec.shape[0], self.in_channels, *_kernel(self.kernel_size))
        return _place_reshape(fragment, spec, out_shape)

    def inverse(self) -> Conv3dToLinear:
        return Conv3dToLinear(self.in_channels, self.kernel_size)


def _place_reshape(fragment: Fragment, spec: TensorSpec, out_shape: tuple[int, ...]
                   ) -> Fragment | None:
    """A whole-tensor reshape is a view of a contiguous destination."""
    if not fragment.aligned or not fragment.region.is_full(out_shape):
        return None
    view = fragment.view.reshaped(spec.shape)
    return None if view is None else Fragment(Region.full(spec.shape), fragment.target, view)
