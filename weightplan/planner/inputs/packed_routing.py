"""What routing sees of a packed checkpoint (:mod:`weightplan.planner.inputs.packed_pairs`):
each stored weight under its logical key, its parts left out; and the pairing less the
weights a model holds as stored (keep-quantized).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from itertools import compress, repeat
from operator import add, attrgetter, eq, is_not, itemgetter, not_, or_

import torch

from weightplan.errors import PlanError
from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.core.makers import fill, slot_setters
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.inputs.packed_pairs import PackedPairing, PackedWeight

_SHAPE, _KEY, _FIRST, _SECOND = attrgetter("shape"), attrgetter("key"), itemgetter(0), itemgetter(1)


def kept_by_model(pairing: PackedPairing | None,
                  held: Mapping[str, torch.dtype]) -> PackedPairing | None:
    """The pairing less the weights a model holds as stored (keep-quantized): a weight
    whose stored weight tensor the model holds in its stored dtype (``held``: the model's
    dtype by name, under the key, or the key with ``model.`` added or its first component
    removed) is routed as its parts, plain reads of the bytes as they are; it moves to
    :attr:`PackedPairing.kept` (the plan's note). A floating parameter under the same
    key (compressed-tensors FP8's ``weight``) is a dequantize's target, not a keep. Told
    in columns, a name at a time (Kimi-K2: 69k weights)."""
    if pairing is None or not pairing.weights:
        return pairing
    firsts = list(map(_FIRST, map(_PARTS, pairing.weights.values())))
    stored = list(map(_DTYPE, firsts))
    if set(stored).isdisjoint(held.values()):  # (no name can hold one: Kimi-K2 in bf16)
        return pairing
    keys = list(map(_KEY, firsts))
    holds = [False] * len(keys)
    for names in (keys, [k.partition(".")[2] for k in keys],
                  list(map(add, repeat("model."), keys))):
        holds = list(map(or_, holds, map(eq, stored, map(held.get, names))))
    if not any(holds):
        return pairing
    kept = dict(compress(pairing.weights.items(), holds))
    freed = {p.key for w in kept.values() for p in w.parts}
    freed |= {w.parts[0].key.rsplit(".", 1)[0] + s for w in kept.values()
              for s in (".weight_shape", ".weight_g_idx")}
    return replace(pairing, weights={k: w for k, w in pairing.weights.items() if k not in kept},
                   companions=pairing.companions - freed, routed={}, kept=kept)


def routed_entries(ckpt: Checkpoint, pairing: PackedPairing | None) -> Checkpoint | None:
    """The checkpoint routing sees (``None``: unchanged): each stored weight under its
    logical key, in its place; its parts left out. ``ckpt`` is the checkpoint whose
    entries ``pairing`` paired (a stored weight's parts are its entries)."""
    if pairing is None or not (pairing.weights or pairing.companions):
        return None
    done = pairing.routed.get(id(ckpt))
    if done is not None and done[0] is ckpt:  # (quant_context and routing both ask)
        return done[1]
    weights = list(pairing.weights.values())
    firsts = list(map(_FIRST, map(_PARTS, weights)))
    # each entry of the checkpoint, a stored weight's first part swapped for its logical
    # entry (told by identity: no key hashed), kept unless it is another companion
    swap = dict(zip(map(id, firsts), _logical_entries(weights, firsts), strict=True))
    values = list(ckpt.entries.values())
    swapped = list(map(swap.get, map(id, values), values))
    first = list(map(is_not, swapped, values))
    if first.count(True) != len(weights):  # (the swap is told by identity: fail closed)
        raise PlanError(f"{ckpt.description}: its entries are not the ones the packed "
                        "weights were paired from; pair this checkpoint before routing it")
    keep = map(or_, map(not_, map(pairing.companions.__contains__, ckpt.entries)), first)
    routed = list(compress(swapped, keep))
    entries: dict[str, TensorEntry] = dict(zip(map(_KEY, routed), routed, strict=True))
    pairing.routed[id(ckpt)] = (ckpt, replace(ckpt, entries=entries))
    return pairing.routed[id(ckpt)][1]


def _logical_entries(weights: list[PackedWeight], firsts: list[TensorEntry]
                     ) -> list[TensorEntry]:
    """:meth:`PackedPairing.entry` of every weight, built column by column (the specs
    shared by shape)."""
    specs: dict[tuple[int, ...], TensorSpec] = {}
    shapes = list(map(_SHAPE, weights))
    for shape in dict.fromkeys(shapes):
        specs[shape] = TensorSpec(shape, torch.bfloat16)
    made = list(map(object.__new__, repeat(TensorEntry, len(weights))))
    fill(made, _ENTRY_SETTERS, (map(_KEY, weights), map(specs.__getitem__, shapes),
                                map(_FILE, firsts), map(_OFFSET, firsts)))
    return made


_ENTRY_SETTERS = slot_setters(TensorEntry, ("key", "spec", "file", "offset"))
_PARTS, _FILE, _OFFSET = attrgetter("parts"), attrgetter("file"), attrgetter("offset")
_DTYPE = attrgetter("spec.dtype")
