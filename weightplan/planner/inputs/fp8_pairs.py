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
from itertools import compress, filterfalse, repeat
from operator import add, attrgetter, gt, not_
from typing import NamedTuple, cast

from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.inputs.quant_config import QuantConfig
from weightplan.planner.core.quant.blocks import FP8_DTYPES, SCALE_DTYPES, Block, grid_fits, scale_grid
from weightplan.planner.core.spec import TensorSpec, short_dtype

ACTIVATION_SUFFIXES = (".activation_scale", ".input_scale")
SCALE_SUFFIX = "_scale_inv"
_SCALE_SUFFIXES = (SCALE_SUFFIX, *ACTIVATION_SUFFIXES)
_FP8 = frozenset(FP8_DTYPES)
_SCALE_DTYPES = frozenset(SCALE_DTYPES)
_SPEC, _SPEC_DTYPE = attrgetter("spec"), attrgetter("dtype")
_new = tuple.__new__


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
    """Pairs without activation scales, by weight key, kept as a column: each weight key's
    scale entry (the weight is the checkpoint's entry of that key; one block for all). A
    :class:`ScaledWeight` is made when one is asked for: :func:`pair_scales` pairs the
    ~46k weights of DeepSeek-V3 without making any, and the builder reads the scales."""

    __slots__ = ("scales", "block", "_weights")

    def __init__(self, scales: dict[str, TensorEntry], weights: Mapping[str, TensorEntry],
                 block: Block) -> None:
        self.scales, self.block, self._weights = scales, block, weights

    def __getitem__(self, key: str) -> ScaledWeight:
        return ScaledWeight(self._weights[key], self.scales[key], self.block)

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
            return 0
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
    """Pair every FP8 weight of ``entries`` with its scale (see the module docstring)."""
    block = config.block if config is not None else (128, 128)
    keys = list(entries)
    scaling = list(map(str.endswith, keys, repeat(_SCALE_SUFFIXES)))
    scale_like = list(compress(keys, scaling))
    columns = _pair_all(entries, keys, scaling, scale_like, block)
    if columns is not None and len(columns[0]) == len(scale_like):
        # as many scale-like keys as pairs, each pair's _scale_inv key one of them: they
        # are the companions, no scale strays and there are no activation scales
        scales = dict(zip(columns[0], columns[2], strict=True))
        return Fp8Pairing(ScaledWeights(scales, entries, block), (), frozenset(scale_like), config)
    activation_like = list(map(str.endswith, scale_like, repeat(ACTIVATION_SUFFIXES)))
    with_activations = True in activation_like
    scale_keys = (list(compress(scale_like, map(not_, activation_like))) if with_activations
                  else scale_like)  # the _scale_inv keys
    found = _rows(entries, columns, block, with_activations) if columns is not None else None
    pairs, problems = (found, []) if found is not None else _pair_each(entries, block)
    companions = frozenset(k for p in pairs.values() for k in p.companions)
    problems.extend(_strays(entries, pairs, filterfalse(companions.__contains__, scale_keys)))
    return Fp8Pairing(pairs, tuple(problems), companions, config)


Columns = tuple[list[str], list[TensorEntry], list[TensorEntry]]


def _pair_all(entries: Mapping[str, TensorEntry], keys: list[str], scaling: list[bool],
              scale_like: list[str], block: Block) -> Columns | None:
    """``(weight keys, weights, scales)`` when every FP8 weight has a scale of a scale
    dtype on its exact ceil grid, found column by column at C speed (by position when
    the scale keys are exactly the weights' in the same order, as in sorted headers);
    ``None`` otherwise (:func:`_pair_each` says which weight has which problem). Each
    entry is read once, for its spec: the entries are cold in cache by now."""
    values = list(entries.values())
    specs = list(map(_SPEC, values))
    fp8 = map(_FP8.__contains__, map(_SPEC_DTYPE, specs))
    weight = list(map(gt, fp8, scaling))  # FP8 and not a scale key: True > False
    weights = list(compress(keys, weight))
    wents = list(compress(values, weight))
    if _in_step(weights, scale_like):  # the scales come in step with their weights
        scales, sspecs = list(compress(values, scaling)), list(compress(specs, scaling))
    else:
        found = list(map(entries.get, map(add, weights, repeat(SCALE_SUFFIX))))
        if not all(found):
            return None
        scales = cast(list[TensorEntry], found)
        sspecs = list(map(_SPEC, scales))
    fits = _grids_fit(list(compress(specs, weight)), sspecs, block)
    return (weights, wents, scales) if fits else None


def _in_step(weights: list[str], scale_like: list[str]) -> bool:
    """Whether ``scale_like[i] == weights[i] + SCALE_SUFFIX`` for every ``i``, told by two
    joined texts (no string made per key): with exactly ``n - 1`` NULs in the first, none
    of its items holds one, so equal texts mean equal items."""
    if len(weights) != len(scale_like) or not weights:
        return len(weights) == len(scale_like)
    joined = "\0".join(scale_like)
    return (joined.count("\0") == len(weights) - 1
            and joined == (SCALE_SUFFIX + "\0").join(weights) + SCALE_SUFFIX)


def _rows(entries: Mapping[str, TensorEntry], columns: Columns, block: Block,
          with_activations: bool) -> dict[str, ScaledWeight]:
    """The pairs of :func:`_pair_all`'s columns, each with its activation scale if any."""
    weights, wents, scales = columns
    activations: Iterable[TensorEntry | None] = repeat(None)
    if with_activations:
        bases = list(map(str.removesuffix, weights, repeat(".weight")))
        first, second = (map(entries.get, map(add, bases, repeat(s))) for s in ACTIVATION_SUFFIXES)
        activations = [a if a is not None else b for a, b in zip(first, second, strict=True)]
    rows = zip(wents, scales, repeat(block), activations, strict=False)  # repeat()s
    return dict(zip(weights, map(_new, repeat(ScaledWeight), rows), strict=True))


def _grids_fit(wspecs: list[TensorSpec], sspecs: list[TensorSpec], block: Block) -> bool:
    """Every scale spec has a scale dtype and exactly the ceil grid of its weight spec,
    checked once per distinct (weight spec, scale spec) pair of objects (entries share
    their specs)."""
    ids = zip(map(id, wspecs), map(id, sspecs), strict=True)
    distinct = dict(zip(ids, zip(wspecs, sspecs, strict=True), strict=True))
    return all(s.dtype in _SCALE_DTYPES and len(w.shape) >= 2
               and scale_grid(w.shape, block) == s.shape for w, s in distinct.values())


def _pair_each(entries: Mapping[str, TensorEntry], block: Block
               ) -> tuple[dict[str, ScaledWeight], list[Fp8Problem]]:
    pairs: dict[str, ScaledWeight] = {}
    problems: list[Fp8Problem] = []
    for key, entry in entries.items():
        if entry.spec.dtype in FP8_DTYPES and not is_scale_key(key):
            found = _pair(entries, entry, block)
            if isinstance(found, ScaledWeight):
                pairs[key] = found
            else:
                problems.append(found)
    return pairs, problems


def _pair(entries: Mapping[str, TensorEntry], weight: TensorEntry, block: Block
          ) -> ScaledWeight | Fp8Problem:
    key, shape = weight.key, weight.spec.shape
    scale = entries.get(scale_key(key))
    expected = scale_grid(shape, block) if len(shape) >= 2 else None
    if scale is None:
        return Fp8Problem(Fp8ProblemKind.MISSING_SCALE, key,
                          f"{key} is {short_dtype(weight.spec.dtype)}{list(shape)} but the "
                          f"checkpoint has no {scale_key(key)}; without it the weight can't "
                          "be dequantized (a plain cast would be wrong). Add the scale "
                          "tensor, or load a checkpoint that has it", shape, None, expected)
    if scale.spec.dtype not in SCALE_DTYPES:
        return Fp8Problem(Fp8ProblemKind.SCALE_DTYPE, scale.key,
                          f"{scale.key} is {short_dtype(scale.spec.dtype)}; a scale is f32, "
                          "bf16, f16 or e8m0 (u8 / f8_e8m0)", shape, scale.spec.shape, expected)
    if not grid_fits(shape, scale.spec.shape, block):
        return Fp8Problem(Fp8ProblemKind.SCALE_GRID, scale.key, _grid_text(weight, scale, block),
                          shape, scale.spec.shape, expected)
    activation = next((entries[k] for k in activation_keys(key) if k in entries), None)
    return ScaledWeight(weight, scale, block, activation)


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
    """Problems for the ``_scale_inv`` keys no pair claimed (in ``entries`` order)."""
    out = []
    for key in unclaimed:
        owner = key.removesuffix(SCALE_SUFFIX)
        if owner in pairs:
            continue
        weight = entries.get(owner)
        if weight is not None and weight.spec.dtype in FP8_DTYPES:
            continue  # its weight's problem is already reported
        what = ("no such tensor" if weight is None
                else f"it is {short_dtype(weight.spec.dtype)}, not FP8")
        out.append(Fp8Problem(Fp8ProblemKind.STRAY_SCALE, key,
                              f"{key} scales {owner}, but {what}: the scale is not applied",
                              None if weight is None else weight.spec.shape, entries[key].spec.shape))
    return out
