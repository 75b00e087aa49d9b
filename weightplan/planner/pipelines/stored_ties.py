"""Ties the checkpoint stores both sides of: loaded apart, settled after the load.

A model declares ``lm_head.weight`` tied to ``model.embed_tokens.weight``
(``tie_word_embeddings=True``) but its checkpoint holds both keys. transformers loads both
and compares them: equal values are tied as declared, different ones stay two tensors
(with a warning to set ``tie_word_embeddings=False``). The plan sees both keys in the
headers, not the values, so it loads each name into a tensor of its own (counted in the
plan's bytes and peak: :func:`~weightplan.planner.inputs.model_info.untie`) and the
executor compares them after the load (``executor/retie.py``).

Refused: under tensor parallel (the ranks would compare their own slices, each deciding
alone) and where either name goes to the disk (nothing resident to compare, and the two
names would be one again when the model is inspected on meta).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from itertools import chain
from operator import attrgetter

from weightplan.errors import ParallelError, PlanError
from weightplan.planner.core.problems import Note
from weightplan.planner.inputs.device import DeviceMap
from weightplan.planner.inputs.model_info import ModelInfo, ModelTensor, untie
from weightplan.planner.keys.routing import Group

FIX = "set tie_word_embeddings=False in the model's config"


def split_stored_ties(info: ModelInfo | None, groups: Sequence[Group], tensor_parallel: bool
                      ) -> ModelInfo | None:
    """``info`` with each tied name the checkpoint stores apart from the name it is tied
    to a tensor of its own (the first name loaded keeps the shared one); ``info`` itself
    when there is none (a model without ties: nothing is looked at)."""
    if info is None:
        return None
    tied = {name: t for name in info.tied_names
            if (t := info.tensors.get(name)) is not None and len(t.aliases) > 1}
    if not tied:
        return info
    claimed: dict[str, list[str]] = {}  # tensor (canonical name) → its names loaded
    for name in _loaded(groups, tied):
        claimed.setdefault(tied[name].name, []).append(name)
    pairs = tuple((names[0], other) for names in
                  (sorted(n, key=tied[n[0]].aliases.index) for n in claimed.values())
                  for other in names[1:])  # (each tensor's names in the model's order)
    if not pairs:
        return info
    if tensor_parallel:
        raise ParallelError(f"{_both(pairs)}: under tp= each rank would compare only its "
                            f"slices; {FIX} if they differ, or drop {pairs[0][1]} from the "
                            "checkpoint if they are equal")
    return untie(info, pairs)


def _loaded(groups: Sequence[Group], tied: Mapping[str, ModelTensor]) -> set[str]:
    """The tied names the groups write: each target key looked up once (a load's groups
    name their outputs by ``targets``), a ``*`` pattern matched against the tied names."""
    targets = set(chain.from_iterable(map(_TARGETS, groups)))
    found = tied.keys() & targets
    starred = [p for p in targets if "*" in p] if "*" in "".join(targets) else []
    for pattern in starred:  # (the join looks at C speed: a load rarely has one)
        rule = re.compile(re.escape(pattern).replace(r"\*", r"\d+"))
        found.update(name for name in tied if rule.fullmatch(name))
    return found


_TARGETS = attrgetter("targets")


def _both(pairs: tuple[tuple[str, str], ...]) -> str:
    kept, name = pairs[0]
    return (f"the model ties {name} to {kept}, but the checkpoint holds both (values unknown "
            "until read)")


def stored_tie_notes(info: ModelInfo) -> list[Note]:
    """One note per tie the checkpoint stores both sides of: what the load does."""
    return [Note(name, f"{name} and {kept}: the model ties them, but the checkpoint holds "
                       "both: loaded as two tensors (both counted here); after the load, "
                       "equal values are tied again (the copy freed), different ones stay "
                       f"two tensors with a warning ({FIX} to say so)")
            for kept, name in info.stored_ties]


def refuse_on_disk(info: ModelInfo | None, devices: DeviceMap | None) -> None:
    """:class:`PlanError` when a name of a tie stored apart goes to the disk."""
    if info is None or devices is None or not info.stored_ties:
        return
    for kept, name in info.stored_ties:
        if devices.offloads(kept) or devices.offloads(name):
            raise PlanError(f"{_both(((kept, name),))}: they would be compared after the "
                            "load, and one is placed on the disk; keep both off the disk "
                            f"(a device map giving them a device), or {FIX} if they differ, "
                            f"or drop {name} from the checkpoint if they are equal")
