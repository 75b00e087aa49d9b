"""What routing sees of a packed checkpoint (:mod:`weightplan.planner.inputs.packed_pairs`):
each stored weight under its logical key, its parts left out; and the pairing less the
weights a model holds as stored (keep-quantized).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from itertools import compress, repeat
from operator import add, attrgetter, eq, is_, itemgetter, not_, or_

import torch

from weightplan.errors import PlanError
from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.inputs.packed_pairs import PackedPairing

_KEY, _FIRST = attrgetter("key"), itemgetter(0)


def kept_by_model(pairing: PackedPairing | None,
                  held: Mapping[str, torch.dtype]) -> PackedPairing | None:
    """The pairing less the weights a model holds as stored (keep-quantized): a weight
    whose stored weight tensor the model holds in its stored dtype (``held``: the model's
    dtype by name, under the key, or the key with ``model.`` added or its first component
    removed) is routed as its parts, plain reads of the bytes as they are; it moves to
    :attr:`PackedPairing.kept` (the plan's note). A floating parameter under the same
    key (compressed-tensors FP8's ``weight``) is a dequantize's target, not a keep. Told
    in columns, a name at a time (Kimi-K2: 69k weights)."""
    if pairing is None or not pairing.stored:
        return pairing
    firsts = list(map(_FIRST, map(_PARTS, pairing.stored)))
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
    kept = {w.key: w for w in compress(pairing.stored, holds)}
    freed = {p.key for w in kept.values() for p in w.parts}
    freed |= {w.parts[0].key.rsplit(".", 1)[0] + s for w in kept.values()
              for s in (".weight_shape", ".weight_g_idx")}
    return replace(pairing, stored=list(compress(pairing.stored, map(not_, holds))),
                   companions=pairing.companions - freed, routed={}, kept=kept,
                   at=list(compress(pairing.at, map(not_, holds))))


def routed_entries(ckpt: Checkpoint, pairing: PackedPairing | None) -> Checkpoint | None:
    """The checkpoint routing sees (``None``: unchanged): each stored weight as its logical
    entry (the :class:`~weightplan.planner.inputs.packed_weight.PackedWeight` itself) in
    its stored weight's place, its parts left out. ``ckpt`` is the checkpoint whose
    entries ``pairing`` paired (each weight's first part is the entry at its position)."""
    if pairing is None or not (pairing.stored or pairing.companions):
        return None
    done = pairing.routed.get(id(ckpt))
    if done is not None and done[0] is ckpt:  # (quant_context and routing both ask)
        return done[1]
    weights, at = pairing.stored, pairing.at
    values = list(ckpt.entries.values())
    if len(at) != len(weights) or (at and max(at) >= len(values)) or not all(
            map(is_, map(values.__getitem__, at), map(_FIRST, map(_PARTS, weights)))):
        raise PlanError(f"{ckpt.description}: its entries are not the ones the packed "
                        "weights were paired from; pair this checkpoint before routing it")
    # each entry kept unless it is a companion; a stored weight's first part (a
    # companion too) swapped for the weight, by position
    dropped = bytearray(map(pairing.companions.__contains__, ckpt.entries))
    deque(map(dropped.__setitem__, at, repeat(0)), maxlen=0)
    deque(map(values.__setitem__, at, weights), maxlen=0)
    routed = list(compress(values, dropped.translate(_FLIP)))
    entries: dict[str, TensorEntry] = dict(zip(map(_KEY, routed), routed, strict=True))
    pairing.routed[id(ckpt)] = (ckpt, replace(ckpt, entries=entries))
    return pairing.routed[id(ckpt)][1]


_FLIP = bytes.maketrans(b"\0\1", b"\1\0")
_PARTS = attrgetter("parts")
_DTYPE = attrgetter("spec.dtype")
