"""``MergeLora``: a LoRA folded into its base weight, ``W + s·B·A``, as one plan op.

Its inputs are the base weight's sources, then the adapter's ``lora_A`` and ``lora_B``
sources (``counts`` streams each); each part first runs its own layout chain (the base
mapping's fused experts, peft's packing of a wrapped parameter), then the delta is added
in float32 (float64 where the output is float64), a block of rows at a time, into the
base weight's own tensor: the output has
the base weight's dtype (rounded once, there), and where that is not the model's (a float32
checkpoint, an FP8 one dequantized to float32) the plan casts it once at the sink. Where
the model's dtype is finer than the base weight's (a bf16 checkpoint into a float32 model),
the output takes the model's dtype instead: the base widened into it, the sum rounded once
there (never first to the checkpoint's dtype); where neither holds the other's values (an
fp16 checkpoint into a bf16 model), float32, rounded once at the sink.

Orientation (peft's ``get_delta_weight``): ``A (r, in)``, ``B (out, r)``, delta ``B·A``
``(out, in)``; transposed (``(in, out)``) for embeddings, ``fan_in_fan_out`` layers and
fused parameters stored ``(E, in, out)`` (gpt-oss). A fused parameter's factors are
packed expert-slowest in ``A (E·r, in)`` and expert-fastest in ``B (out, r·E)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from weightplan.errors import NotInvertibleError, OpError
from weightplan.planner.core.geometry import Fragment, Region, View
from weightplan.planner.core.ops.base import ConversionOp, OpContext, Streams
from weightplan.planner.core.ops.lora_delta import Piece, block_elements, delta_pieces
from weightplan.planner.core.spec import TensorSpec

_PARTS = ("base", "lora_a", "lora_b")


@dataclass(frozen=True, repr=False)
class MergeLora(ConversionOp):
    """``W + scale·B·A``, computed in float32, or float64 into float64 (see the module
    docstring). Not invertible: saving a merged model writes the base layout from the base
    chain alone (the load record keeps it)."""

    compute_dtype = torch.float32  # (an FP8 base weight dequantizes straight to float32)
    merges_adapter = True

    scale: float
    counts: tuple[int, int, int]  # input streams of the base weight, lora_A, lora_B
    base: tuple[ConversionOp, ...] = ()
    lora_a: tuple[ConversionOp, ...] = ()
    lora_b: tuple[ConversionOp, ...] = ()
    experts: int = 1
    transposed: bool = False
    dtype: torch.dtype | None = field(default=None, kw_only=True)  # the output's, when not W's
    precision: torch.dtype = field(default=torch.float32, kw_only=True)  # the sum's (_precision)
    work: int = field(default=0, kw_only=True, compare=False)  # temporaries' bytes
    kept: int = field(default=0, kw_only=True, compare=False)  # update()'s temporaries
    # where each base input lands in the merged tensor (None: the base chain runs on tensors)
    placed: Streams[tuple[Fragment, ...]] | None = field(default=None, kw_only=True,
                                                         compare=False)

    def resolve(self, ctx: OpContext, inputs: Streams[TensorSpec]) -> "MergeLora":
        chains, stages = [], []
        for name, part, keys in zip(_PARTS, self._split(inputs), self._split(ctx.source_keys),
                                    strict=True):
            sub = ctx if name == "base" else OpContext((f"{ctx.target_keys[0]}.{name}",),
                                                       (None,), keys, ctx.config)
            resolved, specs = [], part
            for op in getattr(self, name):
                op = op.resolve(dataclasses.replace(sub, source_keys=keys), specs)
                stages.append((name, op, specs))
                specs = op.infer(specs)
                resolved.append(op)
            chains.append((tuple(resolved), _one(self, name, specs)))
        (base, w), (a_ops, a), (b_ops, b) = chains
        self._check(w, a, b)
        want = ctx.written_dtype(0) if ctx.written_dtype is not None else None
        dtype = None if want is None else _widened(want, w.dtype)
        placed = _place([(op, specs) for name, op, specs in stages if name == "base"], w)
        allocated = {name: 0 for name in _PARTS}
        for name, op, specs in stages:
            if op.allocates:
                allocated[name] += sum(s.nbytes for stream in op.infer(specs) for s in stream)
        precision = _precision(dtype or w.dtype)
        kept = allocated["lora_a"] + allocated["lora_b"] + precision.itemsize * (
            a.numel + b.numel + 2 * block_elements(w.shape))
        work = kept + (allocated["base"] if placed is None else 0)
        return dataclasses.replace(self, base=base, lora_a=a_ops, lora_b=b_ops, work=work,
                                   kept=kept, placed=placed, dtype=dtype, precision=precision)

    def _split(self, streams: tuple) -> tuple[tuple, ...]:
        if len(streams) != sum(self.counts):
            raise OpError(f"{self!r} takes {sum(self.counts)} streams, got {len(streams)}")
        first, second = self.counts[0], self.counts[0] + self.counts[1]
        return tuple(streams[:first]), tuple(streams[first:second]), tuple(streams[second:])

    def _check(self, w: TensorSpec, a: TensorSpec, b: TensorSpec) -> None:
        e = self.experts
        r = a.shape[0] // e if len(a.shape) == 2 else 0
        out, inner = (b.shape[0], a.shape[1]) if len(a.shape) == len(b.shape) == 2 else (0, 0)
        delta = (inner, out) if self.transposed else (out, inner)
        want = (e, *delta) if e > 1 else delta
        if not r or a.shape[0] != r * e or b.shape[1] != r * e or tuple(w.shape) != want:
            raise OpError(f"{self!r}: lora_A {list(a.shape)} and lora_B {list(b.shape)} "
                          f"(rank {r or '?'} × {e} expert(s)) give a delta of {list(want)}, "
                          f"not the base weight's {list(w.shape)}")

    def infer(self, inputs: Streams[TensorSpec]) -> Streams[TensorSpec]:
        w = _inferred(self.base, self._split(inputs)[0])
        return ((w if self.dtype is None else TensorSpec(w.shape, self.dtype),),)

    def forward(self, streams: Streams[torch.Tensor]) -> Streams[torch.Tensor]:
        parts = self._split(streams)
        out = self._base(parts[0])
        for piece in self._pieces(out, parts[1], parts[2], 1):
            piece()
        return ((out,),)

    def place_kept(self, outputs: Streams[tuple[Fragment, ...]], inputs: Streams[TensorSpec]
                   ) -> tuple[tuple[tuple[Fragment, ...], ...] | None, ...] | None:
        """The base weight's inputs land where the base chain puts them in the output (a
        plain load's reads); ``lora_A`` and ``lora_B`` are taken as tensors by
        :meth:`update`. ``None`` where a base op can't place, or the output is widened
        (the reads' bytes are not the output's)."""
        if self.dtype is not None:
            return None
        specs, chain = self._split(inputs)[0], []
        for op in self.base:
            chain.append((op, specs))
            specs = op.infer(specs)
        frags = outputs
        for op, specs in reversed(chain):
            placed = op.place(frags, specs)
            if placed is None:
                return None
            frags = placed
        return (*frags, *(None for _ in range(self.counts[1] + self.counts[2])))

    def update(self, outputs: Streams[torch.Tensor], streams: Streams[torch.Tensor | None],
               workers: int = 1) -> list[Piece]:
        """``W += s·B·A`` where the base weight was read (see :meth:`place_kept`): float32
        (float64 into float64), rounded once into the output's dtype, in pieces
        (:mod:`.lora_delta`)."""
        parts = self._split(streams)
        return self._pieces(outputs[0][0], parts[1], parts[2], workers)

    def update_bytes(self) -> int:
        return self.kept

    def _pieces(self, out: torch.Tensor, lora_a: tuple, lora_b: tuple, workers: int
                ) -> list[Piece]:
        """``out += s·B·A`` (the delta in :func:`_precision` of ``out``, on its device,
        rounded once) as independent pieces (:func:`~.lora_delta.delta_pieces`),
        ``workers`` at once."""
        precision = _precision(out.dtype)
        a = self._chain(self.lora_a, lora_a).to(out.device, precision)
        b = self._chain(self.lora_b, lora_b).to(out.device, precision)
        if self.experts == 1:
            out, a, b = out[None], a[None], b[None]
        else:
            a = a.reshape(self.experts, -1, a.shape[-1])  # (E, r, in): expert axis slowest
            b = b.reshape(b.shape[0], -1, self.experts).permute(2, 0, 1)  # (E, out, r)
        return delta_pieces(out, a, b, self.scale, self.transposed, workers)

    def _base(self, streams: Streams[torch.Tensor]) -> torch.Tensor:
        """The base weight in a tensor of its own: each input copied once into its place
        (no stack or concatenate temporaries) where the base chain places, else its
        chain run (and its result copied when it is a read buffer, not ours to change)."""
        if self.placed is None:
            out = self._chain(self.base, streams)
            if self.dtype is not None:
                return out.to(self.dtype)
            return out if _owns(self.base) else out.clone()
        w = _inferred(self.base, tuple(tuple(TensorSpec.of(t) for t in s) for s in streams))
        out = torch.empty(w.shape, dtype=self.dtype or w.dtype, device=streams[0][0].device)
        for stream, frags in zip(streams, self.placed, strict=True):
            for src, placed in zip(stream, frags, strict=True):
                for f in placed:
                    view = out.as_strided(f.view.shape, f.view.stride, f.view.offset)
                    region = tuple(slice(a, b) for a, b in zip(f.region.starts, f.region.stops,
                                                               strict=True))
                    view.copy_(src[region].reshape(f.view.shape))
        return out

    @staticmethod
    def _chain(ops: tuple[ConversionOp, ...], streams: Streams[torch.Tensor]) -> torch.Tensor:
        values = streams
        for op in ops:
            values = op.forward(values)
        return values[0][0]

    def workspace_bytes(self) -> int:
        return self.work

    def inverse(self) -> ConversionOp:
        raise NotInvertibleError(f"{self!r}: a merged weight can't be split back into the "
                                 "base weight and the adapter")

    def __repr__(self) -> str:
        chains = "; ".join(f"{name.replace('lora_', '')}: "
                           f"{' → '.join(map(repr, getattr(self, name))) or 'as is'}"
                           for name in _PARTS)
        how = f", {self.experts} experts" if self.experts > 1 else ""
        how += ", transposed" if self.transposed else ""
        how += f", into {str(self.dtype).removeprefix('torch.')}" if self.dtype else ""
        within = str(self.precision).removeprefix("torch.")
        return f"MergeLora(W + {self.scale:.6g}·B·A in {within}{how}; {chains})"


def _one(op: MergeLora, name: str, specs: Streams[TensorSpec]) -> TensorSpec:
    """The single tensor a part's chain yields."""
    if len(specs) != 1 or len(specs[0]) != 1:
        raise OpError(f"{op!r}: its {name} chain yields {[len(s) for s in specs]} tensors, "
                      "not one")
    return specs[0][0]


def _inferred(ops: tuple[ConversionOp, ...], specs: Streams[TensorSpec]) -> TensorSpec:
    """The single spec a chain yields, inferred op by op (no tensor, not even on meta)."""
    for op in ops:
        specs = op.infer(specs)
    return specs[0][0]


def _place(chain: list[tuple[ConversionOp, Streams[TensorSpec]]], w: TensorSpec
           ) -> Streams[tuple[Fragment, ...]] | None:
    """The base chain's inputs as fragments of the merged tensor (``ConversionOp.place``
    from the output back), or ``None`` where an op can't place or there is no op."""
    if not chain:
        return None
    frags: Streams[tuple[Fragment, ...]] = (((Fragment(Region.full(w.shape), 0,
                                                       View.contiguous(w.shape)),),),)
    for op, specs in reversed(chain):
        placed = op.place(frags, specs)
        if placed is None:
            return None
        frags = placed
    return frags


def _precision(dtype: torch.dtype) -> torch.dtype:
    """What the sum ``W + s·B·A`` is formed in for an output of ``dtype``: float64 for
    float64 (float32 would round its base weight), else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _widened(want: torch.dtype, have: torch.dtype) -> torch.dtype | None:
    """The output's dtype where the base weight's (``have``) is not enough: the model's
    (``want``) where it holds every value of ``have`` (bf16 into float32); else one holding
    both (an fp16 base into a bf16 model: float32, which the sink rounds once; fp16 first
    would round twice). ``None``: ``have`` holds the model's values (or FP8, not floats)."""
    if not (want.is_floating_point and have.is_floating_point) or min(
            want.itemsize, have.itemsize) < 2:
        return None
    wider = torch.promote_types(want, have)
    return None if wider == have else wider


def _owns(chain: tuple[ConversionOp, ...]) -> bool:
    """Whether a chain's output is a fresh tensor (its last op allocates)."""
    return bool(chain) and chain[-1].allocates


@dataclass(frozen=True, repr=False)
class TakeTrained(ConversionOp):
    """A ``modules_to_save`` copy in place of its base tensor (both read, the copy kept):
    merged, the model holds the trained module. Not invertible; saved as the base was."""

    merges_adapter = True

    counts: tuple[int, int]  # input streams of the base tensor, the trained copy
    base: tuple[ConversionOp, ...] = ()
    trained: tuple[ConversionOp, ...] = ()

    def resolve(self, ctx: OpContext, inputs: Streams[TensorSpec]) -> "TakeTrained":
        first = self.counts[0]
        resolved = []
        for ops, part, keys in ((self.base, inputs[:first], ctx.source_keys[:first]),
                                (self.trained, inputs[first:], ctx.source_keys[first:])):
            chain = []
            for op in ops:
                op = op.resolve(dataclasses.replace(ctx, source_keys=keys), part)
                part = op.infer(part)
                chain.append(op)
            resolved.append(tuple(chain))
        return dataclasses.replace(self, base=resolved[0], trained=resolved[1])

    def infer(self, inputs: Streams[TensorSpec]) -> Streams[TensorSpec]:
        return ((_inferred(self.trained, inputs[self.counts[0]:]),),)

    def forward(self, streams: Streams[torch.Tensor]) -> Streams[torch.Tensor]:
        return ((MergeLora._chain(self.trained, streams[self.counts[0]:]),),)

    def inverse(self) -> ConversionOp:
        raise NotInvertibleError(f"{self!r}: the base tensor it replaced is gone")

    def __repr__(self) -> str:
        return "TakeTrained(the adapter's modules_to_save copy replaces the base)"
