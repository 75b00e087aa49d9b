"""Ops that rearrange axes of one tensor at a time: Permute, Flatten, Unflatten, Reshape;
and a per-tensor value between one and many copies: Collapse, Expand.

peft packs a fused expert parameter's LoRA factors into 2-d weights: ``lora_A`` as
``(E·r, in)`` (expert axis slowest: ``Flatten(0, 1)`` of ``(E, r, in)``) and ``lora_B``
as ``(out, r·E)`` (expert axis *fastest*: ``Permute((1, 2, 0))`` then ``Flatten(1, 2)``
of ``(E, out, r)``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from weightplan.errors import OpError
from weightplan.planner.core.geometry import Fragment, Region, View
from weightplan.planner.core.ops.base import TensorwiseOp, normalize_dim
from weightplan.planner.core.spec import TensorSpec


@dataclass(frozen=True, repr=False)
class Permute(TensorwiseOp):
    """Reorder every tensor's dims (``torch.permute``). Inverse: the inverse permutation."""

    allocates = False

    dims: tuple[int, ...] = (0,)

    def resolve(self, ctx, inputs):
        for stream in inputs:
            for spec in stream:
                self._check(len(spec.shape))
        return self

    def _check(self, ndim: int) -> None:
        if sorted(self.dims) != list(range(ndim)):
            raise OpError(f"{self!r}: {list(self.dims)} is not a permutation of the "
                          f"{ndim} dims of the tensor")

    def forward_one(self, tensor, stream):
        return tensor.permute(self.dims)

    def infer_one(self, spec, stream):
        self._check(len(spec.shape))
        return TensorSpec(tuple(spec.shape[d] for d in self.dims), spec.dtype)

    def place_one(self, fragment, spec, stream):
        """Output dim ``i`` is input dim ``dims[i]``: the region and the view's dims go
        back to the input's order (the view stays strided: peft's ``lora_B`` packing,
        expert axis fastest, lands each expert's factor at its columns)."""
        if not fragment.aligned:
            return None
        self._check(len(spec.shape))
        back = [0] * len(self.dims)
        for i, d in enumerate(self.dims):
            back[d] = i
        r, v = fragment.region, fragment.view
        view = View(tuple(v.shape[i] for i in back), tuple(v.stride[i] for i in back), v.offset)
        if view.shape and view.shape[-1] > 1 and view.stride[-1] != 1:
            return None  # (element by element: the reads would scatter; the op copies once)
        return Fragment(Region(tuple(r.starts[i] for i in back), tuple(r.stops[i] for i in back)),
                        fragment.target, view)

    def inverse(self) -> "Permute":
        back = [0] * len(self.dims)
        for i, d in enumerate(self.dims):
            back[d] = i
        return Permute(tuple(back))


@dataclass(frozen=True, repr=False)
class Flatten(TensorwiseOp):
    """Merge dims ``start..end`` (inclusive) of every tensor into one (non-negative dims).

    Inverse: :class:`Unflatten` with the merged sizes (recorded when the plan resolves,
    or pinned with ``sizes=``).
    """

    start: int = 0
    end: int = 1
    sizes: tuple[int, ...] | None = field(default=None, kw_only=True)

    def resolve(self, ctx, inputs):
        found = None
        for stream in inputs:
            for spec in stream:
                a, b = self._span(len(spec.shape))
                sizes = spec.shape[a:b + 1]
                want = found if found is not None else self.sizes
                if want is not None and sizes != want:
                    raise OpError(f"{self!r}: inputs disagree on the merged sizes "
                                  f"({list(sizes)} vs {list(want)})")
                found = sizes
        return dataclasses.replace(self, sizes=found)

    def _span(self, ndim: int) -> tuple[int, int]:
        a, b = normalize_dim(self, self.start, ndim), normalize_dim(self, self.end, ndim)
        if a > b:
            raise OpError(f"{self!r}: start must not come after end")
        return a, b

    def forward_one(self, tensor, stream):
        return tensor.flatten(*self._span(tensor.dim()))

    def infer_one(self, spec, stream):
        a, b = self._span(len(spec.shape))
        shape = (*spec.shape[:a], math.prod(spec.shape[a:b + 1]), *spec.shape[b + 1:])
        return TensorSpec(shape, spec.dtype)

    def place_one(self, fragment, spec, stream):
        """A fragment spanning the whole merged dim: its view split back into the merged
        sizes (peft's ``lora_A`` packing, expert axis slowest, lands each expert's rows)."""
        a, b = self._span(len(spec.shape))
        sizes, r = tuple(spec.shape[a:b + 1]), fragment.region
        if not fragment.aligned or (r.starts[a], r.stops[a]) != (0, math.prod(sizes)):
            return None
        n = len(sizes)
        region = Region((*r.starts[:a], *(0,) * n, *r.starts[a + 1:]),
                        (*r.stops[:a], *sizes, *r.stops[a + 1:]))
        return Fragment(region, fragment.target, fragment.view.split(a, sizes))

    def inverse(self) -> "Unflatten":
        if self.sizes is None:
            raise OpError(f"{self!r} is not resolved: its inverse needs the merged sizes")
        return Unflatten(self.start, self.sizes)


@dataclass(frozen=True, repr=False)
class Unflatten(TensorwiseOp):
    """Split dim ``dim`` of every tensor into ``sizes``. Inverse: :class:`Flatten`."""

    dim: int = 0
    sizes: tuple[int, ...] = ()

    def resolve(self, ctx, inputs):
        for stream in inputs:
            for spec in stream:
                self.infer_one(spec, 0)
        return self

    def forward_one(self, tensor, stream):
        return tensor.unflatten(normalize_dim(self, self.dim, tensor.dim()), self.sizes)

    def infer_one(self, spec, stream):
        d = normalize_dim(self, self.dim, len(spec.shape))
        if math.prod(self.sizes) != spec.shape[d] or not self.sizes:
            raise OpError(f"{self!r}: {list(self.sizes)} don't multiply to {spec.shape[d]}, "
                          f"the size of dim {d} of {list(spec.shape)}")
        return TensorSpec((*spec.shape[:d], *self.sizes, *spec.shape[d + 1:]), spec.dtype)

    def inverse(self) -> Flatten:
        d = self.dim
        if d < 0:
            raise OpError(f"{self!r}: its inverse needs a non-negative dim")
        return Flatten(d, d + len(self.sizes) - 1, sizes=self.sizes)


@dataclass(frozen=True, repr=False)
class Reshape(TensorwiseOp):
    """Give every tensor the shape ``shape`` (same elements, same order: a view).

    Per-tensor values move between layouts with it: a ModelOpt ``weight_scale_2`` of
    ``()`` is the ``(1,)`` per-tensor grid compressed-tensors stores, and a stack of them
    ``(E, 1)`` is the ``(E,)`` a fused model may hold. Inverse: ``Reshape`` back to the
    inputs' shape (recorded when the plan resolves, or pinned with ``source=``).
    """

    allocates = False

    shape: tuple[int, ...] = ()
    source: tuple[int, ...] | None = field(default=None, kw_only=True)

    def resolve(self, ctx, inputs):
        return _with_source(self, inputs)

    def forward_one(self, tensor, stream):
        return tensor.reshape(self.shape)

    def infer_one(self, spec, stream):
        if math.prod(spec.shape) != math.prod(self.shape):
            raise OpError(f"{self!r}: {list(spec.shape)} has {math.prod(spec.shape)} elements, "
                          f"{list(self.shape)} needs {math.prod(self.shape)}")
        return TensorSpec(tuple(self.shape), spec.dtype)

    def inverse(self) -> "Reshape":
        if self.source is None:
            raise OpError(f"{self!r} is not resolved: its inverse needs the inputs' shape")
        return Reshape(self.source, source=tuple(self.shape))


@dataclass(frozen=True, repr=False)
class Collapse(TensorwiseOp):
    """A tensor whose elements are all one value (bit for bit) → that value, of ``shape``
    (one element): one global scale for all experts, when every expert's is the same.

    Only exact when they are equal: the planner checks the values before it adds the op,
    and the kernel checks them again (a tensor of different values is an error, never a
    pick). Inverse: :class:`Expand` to the inputs' shape (recorded at resolve).
    """

    shape: tuple[int, ...] = ()
    source: tuple[int, ...] | None = field(default=None, kw_only=True)

    def resolve(self, ctx, inputs):
        return _with_source(self, inputs)

    def forward_one(self, tensor, stream):
        flat = tensor.reshape(-1)
        if tensor.device.type != "meta" and flat.numel() and not uniform(flat):
            raise OpError(f"{self!r}: the values differ ({flat[:4].tolist()}…); one value "
                          "can't stand for them")
        return flat[:1].clone().reshape(self.shape)

    def infer_one(self, spec, stream):
        if math.prod(self.shape) != 1 or math.prod(spec.shape) < 1:
            raise OpError(f"{self!r}: collapses a non-empty tensor to one element, not "
                          f"{list(spec.shape)} → {list(self.shape)}")
        return TensorSpec(tuple(self.shape), spec.dtype)

    def inverse(self) -> "Expand":
        if self.source is None:
            raise OpError(f"{self!r} is not resolved: its inverse needs the inputs' shape")
        return Expand(self.source)


@dataclass(frozen=True, repr=False)
class Expand(TensorwiseOp):
    """A one-element tensor repeated to ``shape`` (a fresh tensor). Inverse:
    :class:`Collapse` to the one-element input's shape."""

    shape: tuple[int, ...] = ()
    source: tuple[int, ...] | None = field(default=None, kw_only=True)

    def resolve(self, ctx, inputs):
        found = self.source
        for stream in inputs:
            for spec in stream:
                self.infer_one(spec, 0)
                found = tuple(spec.shape)
        return dataclasses.replace(self, source=found)

    def forward_one(self, tensor, stream):
        return tensor.reshape(()).expand(self.shape).clone()

    def infer_one(self, spec, stream):
        if math.prod(spec.shape) != 1:
            raise OpError(f"{self!r} repeats a one-element tensor, not {list(spec.shape)}")
        return TensorSpec(tuple(self.shape), spec.dtype)

    def inverse(self) -> Collapse:
        return Collapse(self.source if self.source is not None else (), source=tuple(self.shape))


def _with_source(op: Reshape | Collapse, inputs) -> Reshape | Collapse:
    """``op`` with its inputs' one shape recorded (checked as it infers): its inverse's."""
    found = op.source
    for stream in inputs:
        for spec in stream:
            op.infer_one(spec, 0)
            if found is not None and tuple(spec.shape) != found:
                raise OpError(f"{op!r}: inputs disagree on their shape ({list(spec.shape)} "
                              f"vs {list(found)}); its inverse needs one")
            found = tuple(spec.shape)
    return dataclasses.replace(op, source=found)


def uniform(flat: torch.Tensor) -> bool:
    """Whether every element of the 1-d ``flat`` has the first one's bits."""
    bits = flat.contiguous().view(torch.uint8).reshape(flat.numel(), -1)
    return bool((bits == bits[:1]).all())
