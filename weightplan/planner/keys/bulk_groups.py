"""Grouping the keys routed in bulk: a converter's group made from runs, not key by key.

:meth:`Router.route_bulk <weightplan.planner.keys.router.Router.route_bulk>` routes the
keys of one template together, in natural (there: plain string) order, and cuts the keys a
converter claimed without any fix-up into :class:`Run`\\ s: consecutive keys of one group
(one :class:`Token` per converter, head, tail and captured groups). :func:`bulk_group`
joins each group's runs by their first index (``experts.1``, ``experts.11`` and
``experts.111`` are three templates of one stream), and groups every other route the
exact way (:func:`routing._group`). It vouches only for complete groups whose streams
are exactly ``0..n-1`` (or one key without an index) and whose routes all came in runs;
anything else, including every error, is left to :func:`routing._group` on all routes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import itemgetter, not_

from weightplan.planner.inputs.checkpoint import Checkpoint, TensorEntry
from weightplan.planner.keys.routing import Group, Incomplete, Route, _group, bucket_of
from weightplan.planner.keys.transforms import WeightConverter


class Token:
    """Stands for one converter group (:func:`routing.bucket_of` ``ident``), hashed by
    identity: a run's keys share one, and so do the runs of the group's templates."""

    __slots__ = ("converter", "ident")

    def __init__(self, converter: WeightConverter, ident: object):
        self.converter, self.ident = converter, ident


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive keys of one template that ``token``'s converter claimed for source
    ``source_index``, in natural order (``indices``: their index wildcard values)."""

    token: Token
    source_index: int
    routes: list[Route]
    keys: list[str]
    indices: list[int | None]


@dataclass(frozen=True, slots=True)
class Routed:
    """Every key's route in natural order; where keys were routed in bulk, ``idents``
    (per route, its :func:`bucket_of` or its :class:`Token`) and the ``runs``."""

    routes: list[Route]
    idents: list[object] | None  # None: grouping is left to routing._group
    runs: list[Run]


def bulk_group(routed: Routed, checkpoint: Checkpoint
               ) -> tuple[tuple[Group, ...], tuple[Incomplete, ...]] | None:
    """What :func:`routing._group` returns for ``routed.routes``, or ``None`` where this
    can't vouch for it (see the module docstring)."""
    assert routed.idents is not None  # only called on routes made in bulk
    made = _run_groups(routed.runs, checkpoint.entries)
    if made is None:
        return None
    rest = tuple(compress(routed.routes, map(not_, map(isinstance, routed.idents,
                                                       repeat(Token)))))
    tokens = {run.token.ident for run in routed.runs}
    if any(bucket_of(r) in tokens for r in rest if r.claim is not None):
        # a group with keys in runs and others: the exact way only (grouping the others
        # alone would see part of a group, and could raise for a gap that isn't one)
        return None
    groups, incomplete = _group(rest, checkpoint)
    for group in groups:
        made[bucket_of(group.routes[0][0])] = group
    order = [made[i] for i in dict.fromkeys(routed.idents) if i in made]
    return tuple(order), incomplete


def _run_groups(runs: list[Run], entries: Mapping[str, TensorEntry]
                ) -> dict[object, Group] | None:
    streams: dict[Token, list[list[Run]]] = {}
    for run in runs:
        found = streams.get(run.token)
        if found is None:
            found = streams[run.token] = [[] for _ in run.token.converter.sources]
        found[run.source_index].append(run)
    made: dict[object, Group] = {}
    for token, pieces in streams.items():
        group = _run_group(token.converter, pieces, entries)
        if group is None:
            return None
        made[token] = group
    return made


def _run_group(converter: WeightConverter, pieces: list[list[Run]],
               entries: Mapping[str, TensorEntry]) -> Group | None:
    routes: list[tuple[Route, ...]] = []
    sources: list[tuple[TensorEntry, ...]] = []
    for source, runs in zip(converter.sources, pieces, strict=True):
        if not runs:
            return None  # incomplete
        if len(runs) > 1:
            runs = sorted(runs, key=_first_index)
        if source.has_index:
            indices = list(chain.from_iterable(r.indices for r in runs))
            if indices != list(range(len(indices))):
                return None  # gaps or repeats: the exact way says which
        elif len(runs) != 1 or len(runs[0].keys) != 1:
            return None  # several keys for an index-less source
        routes.append(tuple(chain.from_iterable(r.routes for r in runs)))
        keys = list(chain.from_iterable(r.keys for r in runs))
        sources.append(itemgetter(*keys)(entries) if len(keys) > 1 else (entries[keys[0]],))
    if len({len(r) for r, s in zip(routes, converter.sources, strict=True) if s.has_index}) > 1:
        return None
    return Group(converter, tuple(sources), tuple(routes),
                 converter.target_keys(routes[0][0].match))


def _first_index(run: Run) -> int:
    first = run.indices[0]
    return -1 if first is None else first
