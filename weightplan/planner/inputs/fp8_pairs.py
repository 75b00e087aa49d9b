"""Pre-quantized FP8 checkpoints recognised from headers: every FP8 weight with its scale.

A weight ``X.weight`` stored as ``F8_E4M3`` (or ``F8_E5M2``) is paired with
``X.weight_scale_inv`` (and ``X.activation_scale`` when the checkpoint has one); a key
that doesn't end in ``.weight`` (a fused ``experts.gate_up_proj``) with
``<key>_scale_inv``, as transformers names them. Checks, each a :class:`Fp8Problem`
naming the key, both shapes and the expected grid:

- an FP8 weight without its scale (``missing scale``): loading it would be a silent cast;
- a scale whose shape is not the ceil grid ``[..., ⌈R/b0⌉, ⌈C/b1⌉]`` (``scale grid``);
- a scale of a dtype that is no scale (``scale dtype``);
- a scale next to a weight that is not FP8 (``stray scale``), or next to no weight.

Only headers are read. The block comes from ``quantization_config`` (128×128 when the
checkpoint has FP8 weights but no config: DeepSeek-V3's and transformers' default).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from itertools import chain, compress, filterfalse, repeat
from operator import add, attrgetter, gt, not_
from typing import NamedTuple, cast

from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.inputs.quant_config import QuantConfig
from weightplan.planner.core.quant.blocks import FP8_DTYPES, SCALE_DTYPES, Block, grid_fits, scale_grid
from weightplan.planner.core.spec import TensorSpec, short_dtype
from weightplan.planner.inputs.dtype import (
    ACTIVATION_SUFFIXES, SCALE_SUFFIX, SCALE_SUFFIXES as _SCALE_SUFFIXES,
)
_FP8 = frozenset(FP8_DTYPES)
_SCALE_DTYPES = frozenset(SCALE_DTYPES)
_KEY, _SPEC, _SPEC_DTYPE = attrgetter("key"), attrgetter("spec"), attrgetter("dtype")


class Fp8ProblemKind(Enum):
    MISSING_SCALE = "missing scale"
    SCALE_GRID = "scale grid"
    SCALE_DTYPE = "scale dtype"
    STRAY_SCALE = "stray scale"


class ScaledWeight(NamedTuple):
    """An FP8 weight and the tensors that dequantize it (immutable; a tuple, so that
    :func:`pair_scales` builds the ~46k of DeepSeek-V3 at C speed)."""

    weight: TensorEntry
    scale: TensorEntry
    block: Block
    activation: TensorEntry | None = None

    @property
    def companions(self) -> tuple[str, ...]:
        extra = (self.activation.key,) if self.activation is not None else ()
        return (self.scale.key,) + extra


class ScaledWeights(Mapping[str, ScaledWeight]):
    """The pairs :func:`pair_scales` found, by weight key, kept as columns: each weight
    key's scale entry and, where there is one, its activation scale (the weight is the
    checkpoint's entry of that key; one block for all). A :class:`ScaledWeight` is made
    when one is asked for: the ~46k pairs of DeepSeek-V3 are found without making any,
    and the builder reads the scales."""

    __slots__ = ("scales", "activations", "block", "_weights")

    def __init__(self, scales: dict[str, TensorEntry], weights: Mapping[str, TensorEntry],
                 block: Block, activations: Mapping[str, TensorEntry] | None = None) -> None:
        self.scales, self.block, self._weights = scales, block, weights
        self.activations: Mapping[str, TensorEntry] = activations or {}

    def __getitem__(self, key: str) -> ScaledWeight:
        return ScaledWeight(self._weights[key], self.scales[key], self.block,
                            self.activations.get(key))

    def __contains__(self, key: object) -> bool:
        return key in self.scales

    def __iter__(self) -> Iterator[str]:
        return iter(self.scales)

    def __len__(self) -> int:
        return len(self.scales)


@dataclass(frozen=True, slots=True)
class Fp8Problem:
    kind: Fp8ProblemKind
    key: str
    message: str
    weight_shape: tuple[int, ...] | None = None
    scale_shape: tuple[int, ...] | None = None
    expected: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Fp8Pairing:
    """What :func:`pair_scales` found: pairs by weight key, problems, consumed keys."""

    pairs: Mapping[str, ScaledWeight]
    problems: tuple[Fp8Problem, ...]
    companions: frozenset[str]  # scale / activation keys that belong to a weight
    config: QuantConfig | None = field(default=None, compare=False)

    @property
    def quantized(self) -> bool:
        return bool(self.pairs) or any(p.kind is Fp8ProblemKind.MISSING_SCALE
                                       for p in self.problems)

    def __contains__(self, key: str) -> bool:
        return key in self.pairs

    @cached_property
    def scales(self) -> Mapping[str, TensorEntry]:
        """Each paired weight key's scale entry."""
        if isinstance(self.pairs, ScaledWeights):
            return self.pairs.scales
        return {k: p.scale for k, p in self.pairs.items()}

    @cached_property
    def single_block(self) -> tuple[Block] | None:
        """``(block,)`` when every pair has that block; ``None`` when blocks differ or
        there are no pairs."""
        if isinstance(self.pairs, ScaledWeights):
            return (self.pairs.block,) if self.pairs else None
        blocks = {p.block for p in self.pairs.values()}
        return (blocks.pop(),) if len(blocks) == 1 else None

    @property
    def activation_count(self) -> int:
        """How many pairs have an activation scale."""
        if isinstance(self.pairs, ScaledWeights):
            return len(self.pairs.activations)
        return sum(1 for p in self.pairs.values() if p.activation is not None)


def scale_key(key: str) -> str:
    """``X.weight → X.weight_scale_inv``; any other key ``K → K_scale_inv``."""
    return key + SCALE_SUFFIX


def activation_keys(key: str) -> tuple[str, ...]:
    base = key.removesuffix(".weight")
    return tuple(base + s for s in ACTIVATION_SUFFIXES)


def is_scale_key(key: str) -> bool:
    return key.endswith(_SCALE_SUFFIXES)


def weight_key_of(scale: str) -> str | None:
    """The weight a scale key belongs to (``None`` for activation scales)."""
    return scale.removesuffix("_scale_inv") if scale.endswith("_scale_inv") else None


def pair_scales(entries: Mapping[str, TensorEntry], config: QuantConfig | None = None
                ) -> Fp8Pairing:
    """Pair every FP8 weight of ``entries`` with its scale (see the module docstring),
    column by column; the problems are worded weight by weight, in ``entries`` order,
    then the stray scales."""
    block = config.block if config is not None else (128, 128)
    keys, values = list(entries), list(entries.values())
    specs = list(map(_SPEC, values))
    scaling = list(map(str.endswith, keys, repeat(_SCALE_SUFFIXES)))
    is_weight = list(map(gt, map(_FP8.__contains__, map(_SPEC_DTYPE, specs)), scaling))
    weights = list(compress(keys, is_weight))  # FP8 and not a scale key: True > False
    scale_like = list(compress(keys, scaling))
    others = scale_like  # the scale keys that may be activation or stray scales
    if _in_step(weights, scale_like):
        # sorted headers: the scale keys are the weights' own, in order, and no other
        scales: list[TensorEntry | None] = list(compress(values, scaling))
        sspecs: list[TensorSpec | None] = list(compress(specs, scaling))
        others = []
    else:
        scales = list(map(entries.get, map(add, weights, repeat(SCALE_SUFFIX))))
        sspecs = [None if s is None else s.spec for s in scales]
    faults = list(map(_fault, compress(specs, is_weight), sspecs, repeat(block)))
    problems = [_problem(weight, scale, fault, block) for weight, scale, fault
                in zip(compress(values, is_weight), scales, faults, strict=True)
                if fault is not None]
    fits = list(map(not_, faults))
    scale_of = cast(dict[str, TensorEntry],
                    dict(zip(compress(weights, fits), compress(scales, fits), strict=True)))
    activations = _activations(entries, scale_of, others)
    companions = frozenset(chain(map(_KEY, scale_of.values()), map(_KEY, activations.values())))
    pairs = ScaledWeights(scale_of, entries, block, activations)
    problems += _strays(entries, pairs, filterfalse(companions.__contains__, others))
    return Fp8Pairing(pairs, tuple(problems), companions, config)


def _in_step(weights: list[str], scale_like: list[str]) -> bool:
    """Whether ``scale_like[i] == weights[i] + SCALE_SUFFIX`` for every ``i``, told by two
    joined texts (no string made per key): with exactly ``n - 1`` NULs in the first, none
    of its items holds one, so equal texts mean equal items."""
    if len(weights) != len(scale_like) or not weights:
        return False
    joined = "\0".join(scale_like)
    return (joined.count("\0") == len(weights) - 1
            and joined == (SCALE_SUFFIX + "\0").join(weights) + SCALE_SUFFIX)


def _fault(weight: TensorSpec, scale: TensorSpec | None, block: Block) -> Fp8ProblemKind | None:
    """What is wrong with a weight's scale (``None``: nothing; ``scale``: its spec)."""
    if scale is None:
        return Fp8ProblemKind.MISSING_SCALE
    if scale.dtype not in _SCALE_DTYPES:
        return Fp8ProblemKind.SCALE_DTYPE
    if not grid_fits(weight.shape, scale.shape, block):
        return Fp8ProblemKind.SCALE_GRID
    return None


def _activations(entries: Mapping[str, TensorEntry], scale_of: Mapping[str, object],
                 candidates: list[str]) -> dict[str, TensorEntry]:
    """Each paired weight's activation scale, where the checkpoint has one (the first of
    :data:`ACTIVATION_SUFFIXES` found)."""
    if not any(map(str.endswith, candidates, repeat(ACTIVATION_SUFFIXES))):
        return {}
    found = {}
    for key in scale_of:
        activation = next((entries[k] for k in activation_keys(key) if k in entries), None)
        if activation is not None:
            found[key] = activation
    return found


def _problem(weight: TensorEntry, scale: TensorEntry | None, fault: Fp8ProblemKind,
             block: Block) -> Fp8Problem:
    key, shape = weight.key, weight.spec.shape
    expected = scale_grid(shape, block) if len(shape) >= 2 else None
    if scale is None:
        return Fp8Problem(fault, key,
                          f"{at(weight)}{key} is {short_dtype(weight.spec.dtype)}{list(shape)} "
                          f"but the checkpoint has no {scale_key(key)}; without it the weight can't "
                          "be dequantized (a plain cast would be wrong). Add the scale "
                          "tensor, or load a checkpoint that has it", shape, None, expected)
    if fault is Fp8ProblemKind.SCALE_DTYPE:
        return Fp8Problem(fault, scale.key,
                          f"{at(scale)}{scale.key} is {short_dtype(scale.spec.dtype)}; a scale "
                          "is f32, bf16, f16 or e8m0 (u8 / f8_e8m0)", shape, scale.spec.shape, expected)
    named = weight if len(shape) < 2 else scale  # (the tensor its text begins with)
    return Fp8Problem(fault, scale.key, at(named) + _grid_text(weight, scale, block), shape,
                      scale.spec.shape, expected)


def at(entry: TensorEntry) -> str:
    """``"FILE: "``, the file holding ``entry`` (``""`` for a tensor in memory)."""
    return f"{entry.file}: " if entry.file is not None else ""


def _grid_text(weight: TensorEntry, scale: TensorEntry, block: Block) -> str:
    shape = weight.spec.shape
    if len(shape) < 2:
        return (f"{weight.key} is an FP8 tensor of {len(shape)} dims {list(shape)}; block "
                f"scales need a [..., rows, cols] weight")
    what = "one scale per tensor" if block is None else f"blocks {block[0]}×{block[1]}"
    return (f"{scale.key} is {list(scale.spec.shape)} but {weight.key} "
            f"{list(shape)} with {what} needs the ceil grid {list(scale_grid(shape, block))}; "
            "check quantization_config.weight_block_size in config.json")


def _strays(entries: Mapping[str, TensorEntry], pairs: Mapping[str, ScaledWeight],
            unclaimed: Iterable[str]) -> list[Fp8Problem]:
    """Problems for the ``_scale_inv`` keys among the ``unclaimed`` scale keys (in
    ``entries`` order)."""
    out = []
    for key in unclaimed:
        owner = weight_key_of(key)
        if owner is None or owner in pairs:  # an activation scale, or a pair's
            continue
        weight = entries.get(owner)
        if weight is not None and weight.spec.dtype in FP8_DTYPES:
            continue  # its weight's problem is already reported
        what = ("no such tensor" if weight is None
                else f"it is {short_dtype(weight.spec.dtype)}, not FP8")
        out.append(Fp8Problem(Fp8ProblemKind.STRAY_SCALE, key,
                              f"{at(entries[key])}{key} scales {owner}, but {what}: the "
                              "scale is not applied",
                              None if weight is None else weight.spec.shape, entries[key].spec.shape))
    return out
