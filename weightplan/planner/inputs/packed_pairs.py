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
format forbids, a missing part, a plain tensor under the logical key, an ``ignore`` entry
that names no module — each a :class:`PackedProblem` naming the file, key and expected
shape, before any weight byte is read (``weight_shape``'s few bytes: ``in`` is only there).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import chain, compress, islice, repeat
from operator import add, and_, attrgetter, getitem, is_not, itemgetter
from typing import cast

import torch

from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.core.makers import once
from weightplan.planner.core.quant.formats import Scheme
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.small_reads import INTEGER_CODES
from weightplan.planner.inputs.packed_check import pair_one as _pair
from weightplan.planner.inputs.packed_weight import PackedWeight, packed_weights
from weightplan.planner.inputs.packed_problems import PackedProblem, shadowed, strays, unmatched_ignores
from weightplan.planner.inputs.quant_formats import FormatConfig

F8 = torch.float8_e4m3fn
ReadSmall = Callable[[Sequence[TensorEntry]], list[tuple[int, ...]]]  # a batch's values


@dataclass(frozen=True)
class PackedPairing:
    """What :func:`pair_packed` found: the stored weights (in checkpoint order), problems,
    consumed keys (every part, the shape tensors); ``at``: each weight's position among the
    entries it was paired from. A routed entry is the pairing's when a :class:`PackedWeight`."""

    stored: Sequence[PackedWeight]
    problems: tuple[PackedProblem, ...]
    companions: frozenset[str]
    config: FormatConfig
    routed: dict = field(default_factory=dict, compare=False, repr=False)  # see routed_entries
    kept: Mapping[str, PackedWeight] = field(default_factory=dict)  # see kept_by_model
    at: Sequence[int] = field(default=(), compare=False, repr=False)

    @cached_property
    def weights(self) -> Mapping[str, PackedWeight]:
        """The stored weights by logical key."""
        return dict(zip(map(_KEY, self.stored), self.stored, strict=True))

    def entry(self, key: str) -> PackedWeight:
        """The logical entry routing sees: the weight itself (see :class:`PackedWeight`)."""
        return self.weights[key]


def pair_packed(entries: Mapping[str, TensorEntry], config: FormatConfig,
                read_small: ReadSmall, file_of: Callable[[TensorEntry], str] = lambda e: e.file or "<memory>"
                ) -> PackedPairing:
    """Pair every stored weight of ``entries`` under ``config`` (see the module docstring),
    decided once per layout: the stored weights of a key template (every digit made ``1``:
    the layers and experts of a stack) whose scheme, part specs and ``weight_shape``
    values agree share one check, :func:`_pair` of the first of them (Kimi-K2: 69k
    weights, a few dozen layouts). Every ``weight_shape`` is read, in one batch."""
    keys = list(entries)
    templates = _templates(keys)
    known = frozenset(templates)
    in_order = list(entries.values())
    stacks = [stack for template, positions in _by_template(templates, config).items()
              if (stack := _stack(template, positions, keys, entries, in_order, config,
                                  known)) is not None]
    reads = [stack.shape_reads() for stack in stacks]
    got = iter(read_small([e for stack in reads for e in stack[1]]))
    slots: list[PackedWeight | None] = [None] * len(keys)  # by position
    refused: list[tuple[int, PackedProblem]] = []
    used: list[list[str]] = []
    for stack, (rows, _) in zip(stacks, reads, strict=True):
        values: list[Sequence[int] | None] = [None] * len(stack.bases)  # by row
        deque(map(values.__setitem__, rows, islice(got, len(rows))), maxlen=0)
        stack.paired(entries, values, read_small, file_of, used, slots, refused)
        if stack.logical[0].translate(_TO_ONE) in known:  # (a plain tensor under it?)
            shadowed(stack.logical, stack.positions, in_order, entries, file_of, slots, refused)
    companions = frozenset(chain.from_iterable(used))
    at = sorted(chain.from_iterable(stack.positions for stack in stacks))  # (sorted runs)
    stored = list(filter(None, map(slots.__getitem__, at)))  # checkpoint order
    if len(stored) < len(at):  # (a refused weight's position holds no weight)
        at = list(compress(at, map(is_not, map(slots.__getitem__, at), repeat(None))))
    refused.sort(key=_FIRST)
    problems = list(map(_SECOND, refused))
    problems += unmatched_ignores(config, entries, known)
    problems += strays(config, keys, used, companions)
    return PackedPairing(stored, tuple(problems), companions, config, at=at)


_TO_ONE = str.maketrans("0123456789", "1111111111")
_FIRST, _SECOND, _KEY, _SPEC = itemgetter(0), itemgetter(1), attrgetter("key"), attrgetter("spec")
# compressed-tensors' parts of a ``weight_packed``, by role
_CT_PARTS = (("packed", ".weight_packed"), ("scale", ".weight_scale"),
             ("global", ".weight_global_scale"), ("zero", ".weight_zero_point"),
             ("shape", ".weight_shape"), ("g_idx", ".weight_g_idx"))
# the suffixes of a stored weight's key (its first part), by method
_STORED = {"mxfp4": ("_blocks",), "compressed-tensors": (".weight_packed", ".weight"),
           "modelopt": (".weight",)}


def _templates(keys: list[str]) -> list[str]:
    """Each key's template: every digit made ``1`` (one translation of the joined keys)."""
    templates = "\n".join(keys).translate(_TO_ONE).split("\n")
    if len(templates) != len(keys):  # a key holds a newline
        templates = [k.translate(_TO_ONE) for k in keys]
    return templates


def _by_template(templates: list[str], config: FormatConfig) -> dict[str, list[int]]:
    """The positions of the keys that may be stored weights (by their suffix), by
    template, in key order; the templates in the order of their first key."""
    out: dict[str, list[int]] = {}
    maybe = map(str.endswith, templates, repeat(_STORED[config.method]))
    for i in compress(range(len(templates)), maybe):
        template = templates[i]
        at = out.get(template)
        if at is None:
            out[template] = [i]
        else:
            at.append(i)
    return out


def _with(bases: list[str], suffix: str) -> list[str]:
    return list(map(add, bases, repeat(suffix)))


@dataclass(frozen=True, slots=True)
class _Stack:
    """The stored weights of one key template, as columns: each one's position in the
    checkpoint, base (its key less the role's suffix), logical key and scheme
    (``None``: ignored); the suffix of every role the format names, and the part entries
    of each role the checkpoint has (a role whose template has no key is absent for all)."""

    positions: list[int]
    bases: list[str]
    logical: list[str]
    schemes: list[Scheme | None]
    suffixes: dict[str, str]
    parts: dict[str, list[TensorEntry | None]]

    def shape_reads(self) -> tuple[list[int], list[TensorEntry]]:
        """The rows and entries of the ``weight_shape`` tensors of the pack-quantized
        weights that :func:`_shape` will read (an integer vector)."""
        shapes = self.parts.get("shape")
        if shapes is None:
            return [], []
        specs = list(map(getattr, shapes, repeat("spec"), repeat(None)))  # (None: absent)
        rows = list(compress(range(len(shapes)), map(and_, once(specs, _int_vector),
                                                     once(self.schemes, _pack_quantized))))
        return rows, cast(list[TensorEntry], list(map(shapes.__getitem__, rows)))

    def paired(self, entries: Mapping[str, TensorEntry], values: list[Sequence[int] | None],
               read_small: ReadSmall, file_of: Callable[[TensorEntry], str],
               used: list[list[str]], slots: list[PackedWeight | None],
               refused: list[tuple[int, PackedProblem]]) -> None:
        """Each weight of the stack paired (into ``slots``, at its position) or refused
        (onto ``refused``, with its position), one :func:`_pair` per layout; ``used`` gets
        a column per role: the part keys of every weight with a scheme, in the stack's
        order. ``values``: each row's ``weight_shape`` values read (``None``: unread)."""
        n = len(self.bases)
        schemes = self._adjusted()
        used += self._claimed(schemes)
        absent: list[TensorEntry | None] = [None] * n
        one = schemes.count(schemes[0]) == n  # (identity first: C speed)
        for scheme in [schemes[0]] if one else dict.fromkeys(schemes):
            if scheme is None:
                continue
            at = list(range(n)) if one else [i for i, s in enumerate(schemes) if s == scheme]
            columns = [self.parts.get(r, absent) for r in scheme.roles]
            if not one:  # (the rows of this scheme's weights)
                columns = [list(map(c.__getitem__, at)) for c in columns]
            # each weight's layout: its parts' spec objects and its weight_shape values
            layouts: Sequence[tuple] = _layouts(
                [list(map(_SPEC if all(c) else _spec_of, c)) for c in columns]
                + [values if one else list(map(values.__getitem__, at))])
            first = {layouts[0]: at[0]} if layouts.count(layouts[0]) == len(at) else \
                dict(zip(reversed(layouts), reversed(at), strict=True))
            verdict = {layout: self._pair(i, scheme, entries, values, read_small, file_of)
                       for layout, i in first.items()}
            if any(isinstance(v, PackedProblem) for v in verdict.values()):
                for j, i in enumerate(at):  # (each refused weight in its own words; each
                    made = verdict[layouts[j]]  # paired one its own key and parts)
                    made = PackedWeight(  # (its layout's: all parts)
                        self.logical[i], scheme,
                        cast(tuple[TensorEntry, ...], tuple(c[j] for c in columns)), made.shape
                    ) if isinstance(made, PackedWeight) else \
                        self._pair(i, scheme, entries, values, read_small, file_of)
                    if isinstance(made, PackedWeight):
                        slots[self.positions[i]] = made
                    else:
                        refused.append((self.positions[i], made))
                continue
            specs = repeat(_SPEC(verdict[layouts[0]])) if len(verdict) == 1 else \
                map(_SPEC, map(verdict.__getitem__, layouts))
            logical = self.logical if one else list(map(self.logical.__getitem__, at))
            stored = packed_weights(len(at), logical, specs, repeat(scheme),
                                    zip(*columns, strict=True),
                                    cast(list[TensorEntry], columns[0]))
            deque(map(slots.__setitem__, map(self.positions.__getitem__, at), stored), maxlen=0)

    def _claimed(self, schemes: list[Scheme | None]) -> list[list[str]]:
        """A column per role: the part keys of every weight with a scheme, in the stack's
        order; each key as its entry holds it (the checkpoint's own key object: a set of
        them finds each entry's key by identity, without comparing bytes)."""
        have = [s is not None for s in schemes]
        every = have.count(True) == len(have)  # (no weight ignored: told at C speed)
        return [list(map(_KEY, column if every and all(column) else compress(
            column, map(and_, have, map(is_not, column, repeat(None))))))
            for column in self.parts.values()]  # (told by identity: no entry is read)

    def _adjusted(self) -> list[Scheme | None]:
        """The schemes, each as the checkpoint says: gpt-oss's fused experts (U8
        ``[E, in, out]`` blocks) transposed, a weight with a ``g_idx`` act-order."""
        blocks = self.parts.get("blocks")
        if blocks is not None:
            return [replace(s, transpose=True) if s is not None and s.format == "mxfp4"
                    and e is not None and e.spec.dtype == torch.uint8
                    and len(e.spec.shape) == 4 else s
                    for s, e in zip(self.schemes, blocks, strict=True)]
        g_idx = self.parts.get("g_idx")
        if g_idx is not None:
            return [replace(s, act_order=True) if s is not None and s.format == "int"
                    and e is not None and not s.act_order else s
                    for s, e in zip(self.schemes, g_idx, strict=True)]
        return self.schemes

    def _pair(self, i: int, scheme: Scheme, entries: Mapping[str, TensorEntry],
              values: list[Sequence[int] | None], read_small: ReadSmall,
              file_of: Callable[[TensorEntry], str]) -> PackedWeight | PackedProblem:
        names = {role: self.bases[i] + suffix for role, suffix in self.suffixes.items()}
        shape = self.parts["shape"][i] if "shape" in self.parts else None

        def read(entry: TensorEntry) -> Sequence[int]:
            known = values[i] if entry is shape else None
            return known if known is not None else read_small([entry])[0]
        return _pair(self.logical[i], scheme, names, entries, read, file_of)


def _layouts(columns: list[list]) -> Sequence[tuple]:
    """Each weight's layout: the row of its part specs and ``weight_shape`` values; one
    row repeated (a list of one object) when each column holds one value (a stack's
    experts: counted at C speed, identity first, not hashed weight by weight)."""
    if all(c.count(c[0]) == len(c) for c in columns):
        return [tuple(c[0] for c in columns)] * len(columns[0])
    return list(zip(*columns, strict=True))


def _int_vector(spec: TensorSpec | None) -> bool:
    return spec is not None and spec.dtype in INTEGER_CODES and len(spec.shape) == 1


def _pack_quantized(scheme: Scheme | None) -> bool:
    return scheme is not None and scheme.format == "int"


def _spec_of(entry: TensorEntry | None) -> TensorSpec | None:
    return None if entry is None else entry.spec


def _stack(template: str, positions: list[int], keys: list[str],
           entries: Mapping[str, TensorEntry], in_order: list[TensorEntry],
           config: FormatConfig, templates: frozenset[str]) -> _Stack | None:
    """The stored weights among the keys of ``template`` (``None``: none can be);
    ``in_order``: the entries in the order of ``keys``."""
    members = list(map(keys.__getitem__, positions))
    if config.method == "mxfp4":
        if not template.endswith("_blocks"):
            return None
        suffixes, logical = {"blocks": "_blocks", "scales": "_scales"}, ""
        module_of = _mxfp4_module
    elif template.endswith(".weight_packed") and config.method == "compressed-tensors":
        suffixes, logical, module_of = dict(_CT_PARTS), ".weight", _ct_module
    elif template.endswith(".weight"):
        if config.method == "modelopt":
            keep = [entries[k].spec.dtype == torch.uint8 for k in members]
            suffixes = {"packed": ".weight", "scale": ".weight_scale",
                        "global": ".weight_scale_2"}
        else:  # compressed-tensors FP8: an F8 weight, unless DeepSeek's weight_scale_inv
            # is its scale (one without either is refused here, naming weight_scale)
            keep = [entries[k].spec.dtype == F8 and (k + "_scale" in entries
                                                     or k + "_scale_inv" not in entries)
                    for k in members]
            suffixes = {"weight": ".weight", "scale": ".weight_scale"}
        if not any(keep):
            return None
        positions, members = list(compress(positions, keep)), list(compress(members, keep))
        logical, module_of = ".weight", _ct_module
    else:
        return None
    cut = len(next(iter(suffixes.values())))
    bases = _cut(members, cut)
    # the logical key: the stored key less the part of its suffix past the logical one
    # (each stored suffix starts with its logical suffix: ``.weight_packed``, ``.weight``)
    drop = cut - len(logical)
    logicals = bases if drop == cut else members if not drop else _cut(members, drop)
    base_template = template[:-cut]
    if config.digit_blind:
        schemes = [config.scheme_for(module_of(base_template))] * len(members)
    else:
        schemes = list(map(config.scheme_for, map(module_of, bases)))
    # the stored weights themselves by position (no key hashed), their parts by name
    stored, *others = suffixes
    names = {stored: members} | {role: _with(bases, suffixes[role]) for role in others
                                 if (base_template + suffixes[role]).translate(_TO_ONE)
                                 in templates}
    parts: dict[str, list[TensorEntry | None]] = {
        role: list(map(entries.get, names[role])) for role in names if role != stored}
    parts = {stored: list(map(in_order.__getitem__, positions)), **parts}
    return _Stack(positions, bases, logicals, schemes, suffixes, parts)


def _cut(keys: list[str], count: int) -> list[str]:
    """Each key less its last ``count`` characters (sliced at C speed)."""
    return list(map(getitem, keys, repeat(slice(None, -count))))


def _mxfp4_module(base: str) -> str:
    return base.rsplit(".", 1)[0]


def _ct_module(base: str) -> str:
    return base
