"""Problems of a packed checkpoint's pairing (:mod:`weightplan.planner.inputs.packed_pairs`):
the type, and the checks of what pairing leaves over: ``ignore`` entries that name no
module, parts (scales, zero points, shapes) that no stored weight claimed, and a plain
tensor under a stored weight's logical key (two tensors for one weight).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import repeat

from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.inputs.quant_formats import FormatConfig, matches


@dataclass(frozen=True, slots=True)
class PackedProblem:
    key: str
    message: str


def unmatched_ignores(config: FormatConfig, entries: Mapping[str, TensorEntry],
                       templates: frozenset[str]) -> list[PackedProblem]:
    """``ignore`` entries that name no module of the checkpoint (a typo leaves the module
    it meant quantized, or names a module the checkpoint doesn't have). A digit-blind
    list (:attr:`FormatConfig.digit_blind`) matches a key as it matches its template, so
    the templates are searched, else the keys."""
    if not config.ignore:
        return []
    names = templates if config.digit_blind else entries
    return [PackedProblem(p, f"{config.source}: ignore entry {p!r} names no module of the "
                          "checkpoint") for p in config.ignore if not _names_any(p, names)]


def shadowed(logical: list[str], positions: list[int], in_order: list[TensorEntry],
             entries: Mapping[str, TensorEntry], file_of: Callable[[TensorEntry], str],
             slots: list, refused: list[tuple[int, PackedProblem]]) -> None:
    """Refuse each stored weight of a stack (``logical``: each one's logical key,
    ``positions`` its stored entry's in ``in_order``) whose logical key the checkpoint
    also holds as a tensor of its own (a plain ``x.weight`` beside ``x.weight_packed``):
    two tensors for one weight, neither picked. Its slot emptied, its problem onto
    ``refused`` with its position."""
    if logical and logical[0] == in_order[positions[0]].key:
        return  # (a stack stored under its logical keys: FP8, ModelOpt; no key to look up)
    for key, at in zip(logical, positions, strict=True):
        plain, stored = entries.get(key), in_order[at]
        if plain is not None and plain is not stored:
            slots[at] = None
            refused.append((at, PackedProblem(key, (
                f"{file_of(stored)}: {stored.key} is the packed weight {key}, and "
                f"{file_of(plain)} holds {key} as a plain tensor too: two tensors for one "
                "weight (the checkpoint must hold one)"))))


def _names_any(pattern: str, names: Iterable[str]) -> bool:
    """Whether ``pattern`` matches a name of ``names`` or its module."""
    for key in names:
        if matches(pattern, key) or matches(pattern, key.rsplit(".", 1)[0]):
            return True
    return False


_PART_SUFFIXES = {"mxfp4": ("_scales",), "compressed-tensors": (
    ".weight_scale", ".weight_packed", ".weight_global_scale", ".weight_zero_point",
    ".weight_shape", ".weight_g_idx"), "modelopt": (".weight_scale", ".weight_scale_2")}


def strays(config: FormatConfig, keys: list[str], claimed: list[list[str]],
           used: frozenset[str]) -> list[PackedProblem]:
    """Parts no stored weight claimed (a scale whose weight is missing or ignored), in
    checkpoint order. ``claimed``: the part keys of each role of each stack (keys of the
    checkpoint, all of a column with its role's suffix), ``used`` all of them as a set.
    None is a stray when as many keys have a part's suffix as claimed keys do, each
    claimed once (a column counted by its first key)."""
    suffixes = _PART_SUFFIXES[config.method]
    parts = sum(map(str.endswith, keys, repeat(suffixes)))
    if len(used) == sum(map(len, claimed)) and parts == sum(
            len(column) for column in claimed if column and column[0].endswith(suffixes)):
        return []
    out = []
    for key in [k for k in keys if k not in used and k.endswith(suffixes)]:
        module = key.rsplit(".", 1)[0]
        if config.scheme_for(module) is None and config.method != "mxfp4":
            continue  # an ignored module's own tensors
        out.append(PackedProblem(key, f"{key} belongs to no {config.method} weight of the "
                                 "checkpoint (its weight is missing): it is not applied"))
    return out
