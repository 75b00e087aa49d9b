"""Packed-format checkpoints recognised from headers: each stored weight with its parts.

Given a :class:`~weightplan.planner.inputs.quant_formats.FormatConfig`, every stored
weight is found by its suffix and paired with the tensors that dequantize it:

========================  ==================================================================
MXFP4                     ``P_blocks`` U8 ``[..., rows, G, 16]`` + ``P_scales`` U8 → ``P``
compressed-tensors FP8    ``M.weight`` F8 + ``M.weight_scale`` → ``M.weight``
pack-quantized            ``M.weight_packed`` I32 + ``M.weight_scale`` + ``M.weight_shape``
                          (+ ``M.weight_zero_point``) → ``M.weight``
NVFP4 compressed-tensors  ``M.weight_packed`` U8 + ``M.weight_scale`` F8 +
                          ``M.weight_global_scale`` → ``M.weight``
NVFP4 ModelOpt            ``M.weight`` U8 + ``M.weight_scale`` F8 + ``M.weight_scale_2``
========================  ==================================================================

The result is a :class:`PackedWeight` per logical key (the key a floating checkpoint
would have), whose shape is checked against every part's header: a scale grid that
doesn't cover the weight, a packed width that doesn't match ``weight_shape``, a dtype the
format forbids, a missing part, an ``ignore`` entry that names no module — each a
:class:`PackedProblem` naming the file, key and expected shape, before any weight byte is
read (``weight_shape``'s few bytes are read: the exact ``in`` is only there).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import torch

from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.core.quant.formats import Scheme, companion_shapes, logical_shape
from weightplan.planner.core.spec import TensorSpec, short_dtype
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.inputs.quant_formats import FormatConfig, matches

F8 = torch.float8_e4m3fn
_SCALES = (torch.float32, torch.bfloat16, torch.float16)
# role → the dtypes the format allows
_DTYPES: dict[str, dict[str, tuple[torch.dtype, ...]]] = {
    "mxfp4": {"blocks": (torch.uint8,), "scales": (torch.uint8,)},
    "fp8": {"weight": (F8,), "scale": _SCALES},
    "int": {"packed": (torch.int32,), "scale": _SCALES, "zero": (torch.int32,),
            "g_idx": (torch.int32, torch.int64)},
    "nvfp4": {"packed": (torch.uint8,), "scale": (F8,), "global": (torch.float32,)},
}
ReadSmall = Callable[[TensorEntry], list[int]]


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """A stored weight, its parts (in ``scheme.roles`` order) and its logical shape."""

    key: str
    scheme: Scheme
    parts: tuple[TensorEntry, ...]
    shape: tuple[int, ...]

    @property
    def stored_bytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


@dataclass(frozen=True, slots=True)
class PackedProblem:
    key: str
    message: str


@dataclass(frozen=True)
class PackedPairing:
    """What :func:`pair_packed` found: weights by logical key, problems, consumed keys
    (every part, and the shape tensors)."""

    weights: Mapping[str, PackedWeight]
    problems: tuple[PackedProblem, ...]
    companions: frozenset[str]
    config: FormatConfig
    routed: dict = field(default_factory=dict, compare=False, repr=False)  # see routed_entries
    kept: Mapping[str, PackedWeight] = field(default_factory=dict)  # see kept_by_model

    def entry(self, key: str) -> TensorEntry:
        """The logical entry routing sees: the logical key and shape (nominally bf16:
        never read as such, always behind a dequantize) at the stored weight's place."""
        w = self.weights[key]
        return TensorEntry(key, TensorSpec(w.shape, torch.bfloat16), w.parts[0].file,
                           w.parts[0].offset)


def pair_packed(entries: Mapping[str, TensorEntry], config: FormatConfig,
                read_small: ReadSmall, file_of: Callable[[TensorEntry], str] = lambda e: e.file or "<memory>"
                ) -> PackedPairing:
    """Pair every stored weight of ``entries`` under ``config`` (see the module docstring)."""
    weights: dict[str, PackedWeight] = {}
    problems: list[PackedProblem] = []
    used: set[str] = set()
    verdicts: dict[tuple, tuple[int, ...]] = {}
    for key, entry in entries.items():
        found = _stored(key, entry, config, entries)
        if found is None:
            continue
        logical, module, names = found
        scheme = config.scheme_for(module)
        if scheme is None:
            continue
        if scheme.format == "mxfp4" and entry.spec.dtype == torch.uint8 and len(entry.spec.shape) == 4:
            scheme = Scheme("mxfp4", transpose=True, source="mxfp4")  # fused experts: [E, in, out]
        if scheme.format == "int" and names.get("g_idx") in entries and not scheme.act_order:
            scheme = replace(scheme, act_order=True)  # (the checkpoint says act-order)
        made = _pair_cached(logical, scheme, names, entries, read_small, file_of, verdicts)
        if isinstance(made, PackedProblem):
            problems.append(made)
            used.update(n for n in names.values() if n in entries)
            continue
        weights[logical] = made
        used.update(n for n in names.values() if n in entries)
    problems += _unmatched_ignores(config, entries)
    problems += _strays(config, entries, used)
    return PackedPairing(weights, tuple(problems), frozenset(used), config)


def _stored(key: str, entry: TensorEntry, config: FormatConfig, entries: Mapping[str, TensorEntry]
            ) -> tuple[str, str, dict[str, str]] | None:
    """``(logical key, module, part keys by role)`` when ``key`` is a stored weight."""
    if config.method == "mxfp4":
        if not key.endswith("_blocks"):
            return None
        base = key.removesuffix("_blocks")
        return base, base.rsplit(".", 1)[0], {"blocks": key, "scales": base + "_scales"}
    module = key.rsplit(".", 1)[0]
    if config.method == "modelopt":
        if not key.endswith(".weight") or entry.spec.dtype != torch.uint8:
            return None
        return key, module, {"packed": key, "scale": module + ".weight_scale",
                             "global": module + ".weight_scale_2"}
    if key.endswith(".weight_packed"):
        names = {"packed": key, "scale": module + ".weight_scale",
                 "global": module + ".weight_global_scale", "zero": module + ".weight_zero_point",
                 "shape": module + ".weight_shape", "g_idx": module + ".weight_g_idx"}
        return module + ".weight", module, names
    if key.endswith(".weight") and entry.spec.dtype == F8 and module + ".weight_scale" in entries:
        return key, module, {"weight": key, "scale": module + ".weight_scale"}
    return None


def _pair_cached(logical: str, scheme: Scheme, names: dict[str, str],
                 entries: Mapping[str, TensorEntry], read_small: ReadSmall,
                 file_of: Callable[[TensorEntry], str], verdicts: dict[tuple, tuple[int, ...]]
                 ) -> PackedWeight | PackedProblem:
    """:func:`_pair`, its checks run once per layout (the experts of a stack share one):
    keyed by the scheme, every part's spec and the ``weight_shape`` values."""
    parts = tuple(entries.get(names[r]) for r in scheme.roles)
    stored = entries.get(names.get("shape", ""))
    if None in parts or (scheme.format == "int" and (
            stored is None or names.get("g_idx") in entries
            or stored.spec.dtype not in _STRUCT or len(stored.spec.shape) != 1)):
        return _pair(logical, scheme, names, entries, read_small, file_of)
    values = tuple(read_small(stored)) if stored is not None and scheme.format == "int" else ()
    key = (scheme, tuple(p.spec for p in parts), values)  # type: ignore[union-attr]
    shape = verdicts.get(key)
    if shape is not None:
        return PackedWeight(logical, scheme, parts, shape)  # type: ignore[arg-type]
    made = _pair(logical, scheme, names, entries, lambda _: list(values), file_of)
    if isinstance(made, PackedWeight):
        verdicts[key] = made.shape
    return made


def _pair(logical: str, scheme: Scheme, names: dict[str, str], entries: Mapping[str, TensorEntry],
          read_small: ReadSmall, file_of: Callable[[TensorEntry], str]
          ) -> PackedWeight | PackedProblem:
    first = entries[names[scheme.roles[0]]]
    where = f"{file_of(first)}: {logical}"
    if scheme.format == "int" and first.spec.dtype == torch.uint8:
        return PackedProblem(logical, f"{where}: {names['packed']} is u8 (NVFP4's packing) but "
                             "the config says pack-quantized (int32 words)")
    for role in scheme.roles:
        e = entries.get(names[role])
        if e is None:
            return PackedProblem(logical, f"{where}: {scheme.describe()} needs {names[role]} "
                                 "and the checkpoint has none; without it the weight can't be "
                                 "dequantized")
        if e.spec.dtype not in _DTYPES[scheme.format][role]:
            allowed = ", ".join(short_dtype(d) for d in _DTYPES[scheme.format][role])
            return PackedProblem(logical, f"{where}: {e.key} is {short_dtype(e.spec.dtype)}; "
                                 f"{scheme.describe()} stores it as {allowed}")
    shape = _shape(logical, scheme, names, entries, read_small, where)
    if isinstance(shape, PackedProblem):
        return shape
    expected = companion_shapes(scheme, shape)
    parts = tuple(entries[names[r]] for r in scheme.roles)
    for role, part in zip(scheme.roles, parts, strict=True):
        got, want = tuple(part.spec.shape), expected[role]
        if got != want and not (role == "global" and got in ((), (1,))) \
                and not (scheme.strategy == "tensor" and role == "scale" and got in ((), (1,))):
            return PackedProblem(logical, f"{where}: {part.key} is {list(got)} but a weight of "
                                 f"{list(shape)} in {scheme.describe()} needs {list(want)}")
    return PackedWeight(logical, scheme, parts, shape)


def _shape(logical: str, scheme: Scheme, names: dict[str, str], entries: Mapping[str, TensorEntry],
           read_small: ReadSmall, where: str) -> tuple[int, ...] | PackedProblem:
    """The logical shape: from the stored weight, or ``weight_shape``'s values (int)."""
    first = entries[names[scheme.roles[0]]]
    packed = tuple(first.spec.shape)
    if len(packed) < (3 if scheme.format == "mxfp4" else 2):
        return PackedProblem(logical, f"{where}: {first.key} is {list(packed)}; a packed weight "
                             "is a [..., rows, cols] matrix")
    if scheme.format == "mxfp4" and packed[-1] != 16:
        return PackedProblem(logical, f"{where}: {first.key} is {list(packed)}; MXFP4 blocks "
                             "are 16 bytes (32 values) in the last dim")
    if scheme.format != "int":
        return logical_shape(scheme, packed)
    stored = entries.get(names["shape"])
    if stored is None:
        return PackedProblem(logical, f"{where}: pack-quantized needs {names['shape']} (the "
                             "weight's shape) and the checkpoint has none")
    if stored.spec.dtype.is_floating_point or len(stored.spec.shape) != 1 \
            or stored.spec.shape[0] != len(packed):
        return PackedProblem(logical, f"{where}: {stored.key} is {stored.spec}; it must hold "
                             f"{len(packed)} integers")
    shape = logical_shape(scheme, packed, read_small(stored))
    if shape[:-1] != packed[:-1] or shape[-1] < 1:
        return PackedProblem(logical, f"{where}: {stored.key} says {list(shape)} but "
                             f"{first.key} is {list(packed)}")
    return shape


def _unmatched_ignores(config: FormatConfig, entries: Mapping[str, TensorEntry]
                       ) -> list[PackedProblem]:
    """``ignore`` entries that name no module of the checkpoint (a typo leaves the module
    it meant quantized, or names a module the checkpoint doesn't have)."""
    if not config.ignore:
        return []
    return [PackedProblem(p, f"{config.source}: ignore entry {p!r} names no module of the "
                          "checkpoint") for p in config.ignore if not _names_any(p, entries)]


def _names_any(pattern: str, entries: Mapping[str, TensorEntry]) -> bool:
    """Whether ``pattern`` matches a key of ``entries`` or its module, looked for in the
    checkpoint's key order up to the first match (what an ignore list names, attention,
    shared experts, ``lm_head``, comes early in an index; Kimi-K2 has 208k keys)."""
    for key in entries:
        if matches(pattern, key) or matches(pattern, key.rsplit(".", 1)[0]):
            return True
    return False


_PART_SUFFIXES = {"mxfp4": ("_scales",), "compressed-tensors": (
    ".weight_scale", ".weight_packed", ".weight_global_scale", ".weight_zero_point",
    ".weight_shape", ".weight_g_idx"), "modelopt": (".weight_scale", ".weight_scale_2")}


def _strays(config: FormatConfig, entries: Mapping[str, TensorEntry], used: set[str]
            ) -> list[PackedProblem]:
    """Parts no stored weight claimed (a scale whose weight is missing or ignored)."""
    suffixes = _PART_SUFFIXES[config.method]
    out = []
    for key in entries:
        if key in used or not key.endswith(suffixes):
            continue
        module = key.rsplit(".", 1)[0]
        if config.scheme_for(module) is None and config.method != "mxfp4":
            continue  # an ignored module's own tensors
        out.append(PackedProblem(key, f"{key} belongs to no {config.method} weight of the "
                                 "checkpoint (its weight is missing): it is not applied"))
    return out


def kept_by_model(pairing: PackedPairing | None,
                  held: Callable[[str], torch.dtype | None]) -> PackedPairing | None:
    """The pairing less the weights a model holds as stored (keep-quantized): a weight
    whose stored weight tensor the model holds in its stored dtype (``held(key)``: the
    model's dtype under the key, or the key with ``model.`` added or its first component
    removed) is routed as its parts, plain reads of the bytes as they are; it moves to
    :attr:`PackedPairing.kept` (the plan's note). A floating parameter under the same
    key (compressed-tensors FP8's ``weight``) is a dequantize's target, not a keep."""
    if pairing is None or not pairing.weights:
        return pairing

    def holds(entry: TensorEntry) -> bool:
        key = entry.key
        return entry.spec.dtype in (held(key), held(key.partition(".")[2]), held("model." + key))

    kept = {k: w for k, w in pairing.weights.items() if holds(w.parts[0])}
    if not kept:
        return pairing
    freed = {p.key for w in kept.values() for p in w.parts}
    freed |= {w.parts[0].key.rsplit(".", 1)[0] + s for w in kept.values()
              for s in (".weight_shape", ".weight_g_idx")}
    return replace(pairing, weights={k: w for k, w in pairing.weights.items() if k not in kept},
                   companions=pairing.companions - freed, routed={}, kept=kept)


def routed_entries(ckpt: Checkpoint, pairing: PackedPairing | None) -> Checkpoint | None:
    """The checkpoint routing sees (``None``: unchanged): each stored weight under its
    logical key, in its place; its parts left out."""
    if pairing is None or not (pairing.weights or pairing.companions):
        return None
    done = pairing.routed.get(id(ckpt))
    if done is not None and done[0] is ckpt:  # (quant_context and routing both ask)
        return done[1]
    first_part = {w.parts[0].key: key for key, w in pairing.weights.items()}
    entries: dict[str, TensorEntry] = {}
    for key, entry in ckpt.entries.items():
        logical = first_part.get(key)
        if logical is not None:
            entries[logical] = pairing.entry(logical)
        elif key not in pairing.companions:
            entries[key] = entry
    pairing.routed[id(ckpt)] = (ckpt, replace(ckpt, entries=entries))
    return pairing.routed[id(ckpt)][1]


_STRUCT = {torch.int64: "q", torch.int32: "i", torch.int16: "h", torch.int8: "b",
           torch.uint8: "B"}


class SmallReader:
    """Reads tiny integer tensors (``weight_shape``: 2–3 values) at plan time, from the
    in-memory dict or their files' bytes, each file opened once (Kimi-K2 has ~70k)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor] | None) -> None:
        self.tensors = tensors
        self.handles: dict[str, int] = {}  # file → descriptor

    def __call__(self, entry: TensorEntry) -> list[int]:
        if entry.file is None:
            assert self.tensors is not None
            return [int(v) for v in self.tensors[entry.key].reshape(-1).tolist()]
        fd = self.handles.get(entry.file)
        if fd is None:
            fd = self.handles[entry.file] = os.open(entry.file, os.O_RDONLY)
        data = os.pread(fd, entry.nbytes, entry.offset)
        code = _STRUCT.get(entry.spec.dtype)
        if len(data) != entry.nbytes or code is None:
            from weightplan.errors import QuantizationError
            raise QuantizationError(f"{entry.key} is cut short or not an integer tensor "
                                    f"({entry.spec})", file=entry.file, key=entry.key)
        return list(struct.unpack(f"<{entry.spec.numel}{code}", data))

    def raw(self, entry: TensorEntry) -> bytes:
        """A small tensor's bytes as stored (a per-tensor scale's 4: compared bit for bit)."""
        if entry.file is None:
            assert self.tensors is not None
            t = self.tensors[entry.key].detach().contiguous().reshape(-1)
            return t.view(torch.uint8).numpy().tobytes()
        fd = self.handles.get(entry.file)
        if fd is None:
            fd = self.handles[entry.file] = os.open(entry.file, os.O_RDONLY)
        data = os.pread(fd, entry.nbytes, entry.offset)
        if len(data) != entry.nbytes:
            from weightplan.errors import QuantizationError
            raise QuantizationError(f"{entry.key} is cut short ({entry.spec})", file=entry.file,
                                    key=entry.key)
        return data

    def __enter__(self) -> "SmallReader":
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self.handles.values():
            os.close(fd)
        self.handles.clear()
