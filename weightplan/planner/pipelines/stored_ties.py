"""Ties the checkpoint stores both sides of: loaded apart, settled after the load.

A model declares ``lm_head.weight`` tied to ``model.embed_tokens.weight``
(``tie_word_embeddings=True``) but its checkpoint holds both keys. transformers loads both
and compares them: equal values are tied as declared, different ones stay two tensors
(with a warning to set ``tie_word_embeddings=False``). The plan sees both keys in the
headers, not the values, so it loads each name into a tensor of its own (counted in the
plan's bytes and peak: :func:`~weightplan.planner.inputs.model_info.untie`) and the
executor compares them after the load (``executor/retie.py``).

Under tensor parallel the second name is sharded as the tensor it was tied to
(:func:`shard_alike`: the layout the model's modules run the tie with), so each rank
compares its two shards and the ranks agree on one answer. A name placed on the disk is
compared from its offloaded file; the two are tied again only where both sit on one
device (both resident there, or both on the disk).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING

from weightplan.planner.core.problems import Note
from weightplan.planner.inputs.model_info import ModelInfo, ModelTensor, untie
from weightplan.planner.keys.routing import Group

if TYPE_CHECKING:  # (tensor parallel: imported where tp= asks for it)
    from weightplan.planner.tensors.ir.shard_nodes import Sharding

FIX = "set tie_word_embeddings=False in the model's config"


def split_stored_ties(info: ModelInfo | None, groups: Sequence[Group]) -> ModelInfo | None:
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
    return untie(info, pairs)


def shard_alike(sharding: Sharding | None, info: ModelInfo | None) -> Sharding | None:
    """``sharding`` with each tie's second name placed as the name it was tied to: one
    tensor under the model's plan (which names it once), so the ranks' shards of the two
    cover the same elements and compare shard by shard."""
    if sharding is None or info is None or not info.stored_ties:
        return sharding
    import dataclasses
    from types import MappingProxyType

    params = dict(sharding.plan.params)
    for kept, name in info.stored_ties:
        if kept in params:
            params[name] = dataclasses.replace(params[kept], name=name)
        else:
            params.pop(name, None)  # (plain on every rank, as the tensor it was)
    plan = dataclasses.replace(sharding.plan, params=MappingProxyType(params))
    return dataclasses.replace(sharding, plan=plan)


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


def stored_tie_notes(info: ModelInfo) -> list[Note]:
    """One note per tie the checkpoint stores both sides of: what the load does."""
    return [Note(name, f"{name} and {kept}: the model ties them, but the checkpoint holds "
                       "both: loaded as two tensors (both counted here); after the load, "
                       "equal values are tied again (the copy freed; under tp= the ranks "
                       "compare their shards and agree), different ones stay two tensors "
                       f"with a warning ({FIX} to say so)")
            for kept, name in info.stored_ties]
