"""One list of transforms applied to the keys of one key template (:mod:`templates`).

The rule, per key: every renaming that matches fires, in list order, chained; then the
first converter that matches claims the key (:func:`apply`). Keys that differ only in
their digits (one template) are routed together: the rule runs once on the template
(:class:`Decision`: which renamings match, which converter claims the key and where);
each key then replays only the renamings that match, and its converter match is sliced
out of it at the template's spans (:class:`~.templates.MatchShape`), for all the keys in
C-level passes. Where the template can't decide (a key with a leading zero has no
template; a transform that tells digits apart is not digit-blind; renamings move digits
the keys differ in where a literal digit of a regex could reach them, see
:func:`~.templates.apart`) the keys take the rule one by one, each transform over all of
them (:meth:`Applier.each`: one whose literals none of the names holds is skipped for
all): :meth:`Applier.batch` chooses by ``decided is None``.

A :class:`Batch` holds the routes and, for grouping (:mod:`~.groups`), each route's
group (:func:`~.routing.bucket_of`) and the claimed routes cut into :class:`Run`\\ s.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, groupby, repeat
from operator import itemgetter

from weightplan.planner.core.makers import columns
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.keys.patterns import PatternMatch
from weightplan.planner.keys.routing import Route, bucket_of
from weightplan.planner.keys.templates import (
    MatchShape, Moves, all_blind, apart, coarse, digit_free, probe,
)
from weightplan.planner.keys.transforms import (
    ConverterMatch, PatternTransform, Renaming, WeightConverter,
)

_routes, _claims = columns(Route), columns(ConverterMatch)


@dataclass(frozen=True, slots=True, eq=False)
class Run:
    """Keys of one converter group's source stream, next to each other in one batch
    (``indices``: their index wildcard values, ``None`` for a source without one)."""

    ident: object  # the group: bucket_of of each of its routes
    source_index: int
    routes: list[Route]
    keys: list[str]
    indices: list[int | None]


@dataclass(frozen=True, slots=True)
class Batch:
    """Routes of some keys, each route's group (:func:`bucket_of`), the claimed routes in runs."""

    routes: list[Route]
    idents: Sequence[object]
    runs: list[Run]


def apply(key: str, renamings: Sequence[Renaming], converters: Sequence[WeightConverter]
          ) -> Route:
    """The rule for one key: the renamings chained, then the first converter that matches
    (what :meth:`Applier.batch` gives each key, by template or :meth:`Applier.each`: the
    reference its property test holds them to)."""
    name, fired = renamed(key, renamings)
    for c in converters:
        m = c.match(name)
        if m is not None:
            return Route(key, name, fired, c, m)
    return Route(key, name, fired)


def renamed(key: str, renamings: Iterable[Renaming]) -> tuple[str, tuple[Renaming, ...]]:
    """``key`` after every renaming that fires on it, in order, and those that fired."""
    name, fired = key, []
    for r in renamings:
        new = r.rename(name)
        if new is not None:
            fired.append(r)
            name = new
    return name, tuple(fired)


def lands(route: Route, names: ModelInfo | frozenset[str]) -> bool:
    """Whether ``route`` writes one of ``names`` (a converter whose target has an index
    wildcard may: where is asked later)."""
    if route.converter is None:
        return route.renamed in names
    targets = route.converter.target_keys(route.match)
    return any(t in names for t in targets if "*" not in t) or any("*" in t for t in targets)


@dataclass(frozen=True, slots=True)
class Decision:
    """What one list of transforms does to every key of one template."""

    name: str  # the template after the renamings that fire on it
    matched: tuple[Renaming, ...]  # the renamings that match (each key asks if they fire)
    fires: tuple[Renaming, ...]  # those of them that change the template
    converter: WeightConverter | None
    shape: MatchShape | None  # where the converter matched the template's name
    landable: bool  # some key of this template may land in the model
    # where each key's numbers land in its name when every matched renaming replaces text
    # holding none of them (:func:`~.templates.spliced`); else None: each key replays them
    moves: Moves | None = None


class Applier:
    """:func:`apply` for one list of transforms, decided once per key template."""

    def __init__(self, renamings: Sequence[Renaming], converters: Sequence[WeightConverter],
                 model_templates: frozenset[str] | None):
        self.renamings, self.converters = tuple(renamings), tuple(converters)
        self.blind = all_blind(self.renamings) and all_blind(self.converters)
        # (a literal digit in a regex: the renamings are followed on a probe, see _decide)
        self.follow = not all(map(digit_free, (*self.renamings, *self.converters)))
        self.model_templates = model_templates  # the model's keys, every digit made 1
        self.memo: dict[str, Decision | None] = {}

    def decision(self, template: str | None) -> Decision | None:
        """What the transforms do to ``template``'s keys; ``None`` where it can't tell."""
        if template is None or not self.blind:
            return None
        if template not in self.memo:
            self.memo[template] = self._decide(template)
        return self.memo[template]

    def batch(self, keys: list[str], decided: Decision | None) -> Batch:
        """The routes of ``keys`` (of the template ``decided`` was made for, in string
        order): from the decision, or key by key where there is none."""
        if decided is None:
            return batch_of(self.each(keys))
        count = len(keys)
        names: list[str] = keys
        fired: Iterable[tuple[Renaming, ...]] = repeat(())
        if decided.matched and decided.moves is not None:  # (their text the same in every key)
            names, fired = decided.moves.names(keys), repeat(decided.fires)
        elif decided.matched:  # (each key asks the renamings that match its template)
            pairs = [renamed(key, decided.matched) for key in keys]
            names, fired = [name for name, _ in pairs], [f for _, f in pairs]
        if decided.converter is None:
            routes = _routes(count, keys, names, fired, repeat(None), repeat(None), repeat(""), repeat(None))
            return Batch(routes, keys, [])  # (a plain key is a group of its own)
        return _claimed(keys, names, fired, decided)

    def each(self, keys: list[str]) -> list[Route]:
        """:func:`apply` on each of ``keys``, transform by transform over all of them: one
        that :meth:`~.transforms.WeightTransform.may_match` none of their names (their
        joined text holds none of its sources' literals) is skipped for all; the others are
        asked key by key, as ``apply`` asks them."""
        count = len(keys)
        names = list(keys)
        fired: list[tuple[Renaming, ...]] = [()] * count
        for r in self.renamings:
            if not r.may_match("\n".join(names)):
                continue
            for i, name in enumerate(names):
                new = r.rename(name)
                if new is not None:
                    names[i] = new
                    fired[i] += (r,)
        converters: list[WeightConverter | None] = [None] * count
        claims: list[ConverterMatch | None] = [None] * count
        pending: Sequence[int] = range(count)
        for c in self.converters:
            if not pending:
                break
            if not c.may_match("\n".join(map(names.__getitem__, pending))):
                continue
            left = []
            for i in pending:
                m = c.match(names[i])
                if m is None:
                    left.append(i)
                else:
                    converters[i], claims[i] = c, m
            pending = left
        return _routes(count, keys, names, fired, converters, claims, repeat(""), repeat(None))

    def _decide(self, template: str) -> Decision | None:
        matched, fires, name = [], [], template
        twos = probe(template) if self.follow else name  # (see templates.apart)
        moves: Moves | None = Moves.of(template)
        for r in self.renamings:
            if isinstance(r, PatternTransform) and r.first_match(name) is None:
                continue  # (it misses the template: it misses every key of it)
            new = r.rename(name)
            if new is not None or isinstance(r, PatternTransform):  # (a prefix change
                matched.append(r)  # fires on a key if and only if it fires on its template)
                moves = moves and moves.spliced(r, name)
            if new is not None:
                fires.append(r)
                name = new
            if self.follow:  # (the probe too, changed or not: keys may be where it isn't)
                moved = r.rename(twos)
                twos = twos if moved is None else moved
                if apart(name, twos):
                    return None  # a regex after this might tell the keys apart
        for c in self.converters:
            shape = MatchShape.of(c, name)
            if shape is not None:
                landable = self._landable(Route(template, name, (), c, c.match(name)))
                return Decision(name, tuple(matched), tuple(fires), c, shape, landable,
                                moves and moves.to(name))
        landable = self._landable(Route(template, name, ()))
        return Decision(name, tuple(matched), tuple(fires), None, None, landable,
                        moves and moves.to(name))

    def _landable(self, route: Route) -> bool:
        """Whether a key of the template ``route`` was made for may land: its name or a
        target, every digit made ``1``, is a model key's (the keys differ from the
        template in digits alone)."""
        if self.model_templates is None:
            return True
        if route.converter is None:
            return coarse(route.renamed) in self.model_templates
        targets = route.converter.target_keys(route.match)
        return any("*" in t or coarse(t) in self.model_templates for t in targets)


def _claimed(keys: list[str], names: list[str], fired: Iterable[tuple[Renaming, ...]],
             decided: Decision) -> Batch:
    """The routes of the keys ``decided.converter`` claims: each key's match sliced out of
    its name at the template's spans, one :class:`PatternMatch` per index and captured
    groups, heads and tails interned (a group's keys share them); cut into runs where
    the group (head, tail, captured groups) changes. Where the match captures no group
    and no digit follows it, every tail is the template's: a group is told apart by its
    head alone, and a match by its index (``by_head``: worth about 2% of ``explain``)."""
    shape, converter = decided.shape, decided.converter
    assert shape is not None and converter is not None  # a claiming decision has both
    count, spans, tail = len(names), shape.group_spans, decided.name[shape.end:]
    by_head = not spans and "1" not in tail
    heads = list(map(sys.intern, map(itemgetter(slice(None, shape.start)), names)))
    tails = (list(repeat(sys.intern(tail), count)) if by_head
             else list(map(sys.intern, map(itemgetter(slice(shape.end, None)), names))))
    groups: list[tuple[str | None, ...]] = (
        [tuple([None if s is None else name[s[0]:s[1]] for s in spans]) for name in names]
        if spans else list(repeat((), count)))
    runs_at, begin = [], 0
    for found, same in groupby(heads if by_head else zip(heads, tails, groups, strict=True)):
        stop = begin + len(list(same))
        runs_at.append((*((found, tails[0], ()) if by_head else found), begin, stop))
        begin = stop
    rising = not decided.matched and shape.only_index(decided.name)  # (see _indices)
    indices = _indices(names, shape, runs_at, rising)
    seen: list = indices if by_head else list(zip(indices, groups, strict=True))
    made = {one: _match(shape, *((one, ()) if by_head else one)) for one in set(seen)}
    claims = _claims(count, repeat(shape.source_index), heads, tails, map(made.__getitem__, seen))
    routes = _routes(count, keys, names, fired, repeat(converter), claims, repeat(""), repeat(None))
    runs = [Run((id(converter), head, tail, group), shape.source_index, routes[begin:stop],
                keys[begin:stop], indices[begin:stop])
            for head, tail, group, begin, stop in runs_at]
    idents = list(chain.from_iterable(repeat(run.ident, len(run.keys)) for run in runs))
    return Batch(routes, idents, runs)


def _match(shape: MatchShape, index: int | None, groups: tuple[str | None, ...]
           ) -> PatternMatch:
    return PatternMatch(shape.start - shape.scope, shape.end - shape.scope, index, groups)


def _indices(names: list[str], shape: MatchShape, runs_at: list, rising: bool
             ) -> list[int | None]:
    """Each name's index. Where the names are the keys themselves, in string order, and
    differ inside the match in no digit but the index's (``rising``), a run's indices
    rise one by one when the last is the first plus their count less one (keys of one
    template write their numbers with the same count of digits: their string order is
    the indices'; worth about 1% of ``explain``); else each is read."""
    if shape.index_span is None:
        return list(repeat(None, len(names)))
    at = itemgetter(slice(*shape.index_span))
    indices: list[int | None] = []
    for *_, begin, stop in runs_at:
        first, last = int(at(names[begin])), int(at(names[stop - 1]))
        if rising and last - first == stop - begin - 1:
            indices += range(first, last + 1)
        else:
            indices += map(int, map(at, names[begin:stop]))
    return indices


def batch_of(routes: list[Route]) -> Batch:
    """A batch of routes made one by one: each route's group, and the claimed routes cut
    into runs where their group or source changes."""
    idents = list(map(bucket_of, routes))
    runs: list[Run] = []
    claimed = [(ident, r) for ident, r in zip(idents, routes, strict=True) if r.claim]
    for (ident, source_index), same in groupby(claimed, key=_stream):
        members = [r for _, r in same]
        runs.append(Run(ident, source_index, members, [r.key for r in members],
                        [r.match.match.index for r in members]))
    return Batch(routes, idents, runs)


def _stream(pair: tuple[object, Route]) -> tuple[object, int]:
    return pair[0], pair[1].match.source_index
