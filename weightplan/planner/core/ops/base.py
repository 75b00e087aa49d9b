"""The conversion-op protocol.

An op transforms *streams*: a tuple with one entry per source pattern (or per produced
output), each a tuple of tensors (several when an index wildcard collected a list).
For example Mixtral's fused experts go ``((w1_0..w1_7), (w3_0..w3_7))`` →
``MergeModulelist(0)`` → ``((W1,), (W3,))`` → ``Concatenate(1)`` → ``((gate_up,),)``.

Protocol, in the order the planner and executor call it:

1. ``resolve(ctx, inputs)`` at plan time returns a concrete op (sizes, head counts
   filled in from the model) or raises :class:`OpError`;
2. ``infer(inputs)`` gives output specs (the default runs ``forward`` on meta tensors);
3. ``wiring(inputs)`` says which inputs each output depends on (for the graph);
4. ``place(outputs, inputs)`` maps destination fragments of the outputs back to the
   inputs, so bytes can be read straight into their final place (``None``: the op must
   run on materialized tensors);
5. ``forward(streams)`` is the kernel;
6. ``inverse()`` is the exact inverse op, used when saving.

An op whose output is some of its inputs, changed in place by the others (a LoRA merge:
``W + s·B·A``), can say so instead of placing: ``place_kept(outputs, inputs)`` maps the
outputs' fragments back to the inputs that land in them unchanged (``None`` for the
streams it takes as tensors), and ``update(outputs, streams)`` then finishes the outputs
where they lie, from the other inputs: a plain load's reads, and one pass over the bytes.

A user-defined op subclasses :class:`ConversionOp` and implements at least ``forward``
and ``inverse``; the defaults of the rest are correct, only less precise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import repeat
from typing import ClassVar, TypeVar

import torch

from weightplan.errors import NotInvertibleError, OpError
from weightplan.planner.core.geometry import Fragment
from weightplan.planner.core.spec import TensorSpec

T = TypeVar("T")
Streams = tuple[tuple[T, ...], ...]
Wiring = tuple[tuple[tuple[tuple[int, int], ...], ...], ...]


@lru_cache(maxsize=1024)
def stream_positions(stream: int, count: int) -> tuple[tuple[int, int], ...]:
    """``(stream, 0) .. (stream, count - 1)``: a whole stream's positions, one tuple per
    (stream, count) shared by every conversion: a builder that meets it (by identity) in a
    wiring takes the stream as it is instead of item by item."""
    return tuple(zip(repeat(stream), range(count)))


@dataclass(frozen=True)
class OpContext:
    """What an op may look at while resolving: the group's keys and the model's view."""

    target_keys: tuple[str, ...]
    target_specs: tuple[TensorSpec | None, ...]  # model tensor per target (None: not in model)
    source_keys: tuple[tuple[str, ...], ...]
    config: object | None = field(default=None, compare=False)
    # the dtype target ``i`` is written in when its chain yields floats (``None``: unknown)
    written_dtype: Callable[[int], torch.dtype | None] | None = field(default=None,
                                                                      compare=False)


class ConversionOp:
    """Base class of conversion ops (see the module docstring for the protocol)."""

    many_to_many: ClassVar[bool] = False
    allocates: ClassVar[bool] = True  # False: forward returns views of its inputs
    compute_dtype: ClassVar[torch.dtype | None] = None  # FP8 inputs dequantize to it, when set
    merges_adapter: ClassVar[bool] = False  # True: saved as the base chain it merged into

    def resolve(self, ctx: OpContext, inputs: Streams[TensorSpec]) -> "ConversionOp":
        return self

    def infer(self, inputs: Streams[TensorSpec]) -> Streams[TensorSpec]:
        metas = tuple(tuple(s.meta() for s in stream) for stream in inputs)
        return tuple(tuple(TensorSpec.of(t) for t in stream) for stream in self.forward(metas))

    def wiring(self, inputs: Streams[TensorSpec]) -> Wiring:
        every = tuple((i, j) for i, stream in enumerate(inputs) for j in range(len(stream)))
        return tuple(tuple(every for _ in stream) for stream in self.infer(inputs))

    def place(self, outputs: Streams[tuple[Fragment, ...]], inputs: Streams[TensorSpec]
              ) -> Streams[tuple[Fragment, ...]] | None:
        return None

    def forward(self, streams: Streams[torch.Tensor]) -> Streams[torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def place_kept(self, outputs: Streams[tuple[Fragment, ...]], inputs: Streams[TensorSpec]
                   ) -> tuple[tuple[tuple[Fragment, ...], ...] | None, ...] | None:
        """Where the inputs that land unchanged in the outputs go, by stream (``None``: a
        stream :meth:`update` takes as tensors); ``None``: the op runs on tensors."""
        return None

    def update(self, outputs: Streams[torch.Tensor], streams: Streams[torch.Tensor | None],
               workers: int = 1) -> Sequence[Callable[[], None]]:
        """What finishes ``outputs`` (the destinations' own elements, holding the inputs
        :meth:`place_kept` placed) in place from the other inputs (``None`` at the placed
        positions): pieces writing disjoint elements, for the caller to run in any order,
        ``workers`` of them at once on threads holding torch at one intra-op thread."""
        raise NotImplementedError(f"{type(self).__name__}.update")

    def update_bytes(self) -> int:
        """Temporaries :meth:`update` allocates (the schedule counts them)."""
        return 0

    def inverse(self) -> "ConversionOp":
        raise NotInvertibleError(f"{self!r} has no inverse")

    def workspace_bytes(self) -> int:
        """Temporaries ``forward`` allocates besides its outputs (the schedule counts them)."""
        return 0

    def __repr__(self) -> str:
        if not dataclasses.is_dataclass(self):
            return f"{type(self).__name__}()"
        shown = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.startswith("_") or (f.kw_only and value == f.default):
                continue
            shown.append(f"{f.name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


class TensorwiseOp(ConversionOp):
    """An op applied to every tensor on its own; stream structure is unchanged."""

    def forward_one(self, tensor: torch.Tensor, stream: int) -> torch.Tensor:
        raise NotImplementedError

    def infer_one(self, spec: TensorSpec, stream: int) -> TensorSpec:
        """Shape/dtype of one output (default: run ``forward_one`` on a meta tensor)."""
        return TensorSpec.of(self.forward_one(spec.meta(), stream))

    def infer(self, inputs: Streams[TensorSpec]) -> Streams[TensorSpec]:
        return tuple(tuple(self.infer_one(s, i) for s in stream) for i, stream in enumerate(inputs))

    def place_one(self, fragment: Fragment, spec: TensorSpec, stream: int) -> Fragment | None:
        return None

    def forward(self, streams: Streams[torch.Tensor]) -> Streams[torch.Tensor]:
        return tuple(tuple(self.forward_one(t, i) for t in stream)
                     for i, stream in enumerate(streams))

    def wiring(self, inputs: Streams[TensorSpec]) -> Wiring:
        return tuple(tuple(((i, j),) for j in range(len(stream))) for i, stream in enumerate(inputs))

    def place(self, outputs, inputs):
        placed = []
        for i, (out_stream, in_stream) in enumerate(zip(outputs, inputs, strict=True)):
            row = []
            for frags, spec in zip(out_stream, in_stream, strict=True):
                mapped = tuple(self.place_one(f, spec, i) for f in frags)
                if any(m is None for m in mapped):
                    return None
                row.append(mapped)
            placed.append(tuple(row))
        return tuple(placed)


def normalize_dim(op: ConversionOp, dim: int, ndim: int) -> int:
    d = dim + ndim if dim < 0 else dim
    if not 0 <= d < max(ndim, 1):
        raise OpError(f"{op!r}: dim {dim} is out of range for a {ndim}-d tensor")
    return d


def single_input(op: ConversionOp, inputs: Streams[TensorSpec]) -> TensorSpec:
    if len(inputs) != 1 or len(inputs[0]) != 1:
        shape = [len(s) for s in inputs]
        raise OpError(f"{op!r} takes exactly one tensor; got streams of sizes {shape}")
    return inputs[0][0]


def flat(streams: Streams[T]) -> tuple[T, ...]:
    return tuple(x for stream in streams for x in stream)
