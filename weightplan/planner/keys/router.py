"""Routing at frontier scale: each key *template* is routed once (:mod:`templates`).

:func:`~weightplan.planner.keys.routing.route_checkpoint` routes every key through a
:class:`Router`: per list of transforms (the mapping, and the four base-model-prefix
fix-up orders) an :class:`Applier` decides once per template which renamings match and
which converter claims the key and where; each real key then replays only those
renamings and slices its match out of the converter's spans. A fix-up none of whose
template's keys could land in the model (its target's template is not a model key's
template) is skipped without replaying. Transforms that can tell digits apart, and keys
with leading zeros, take the plain per-key path (:func:`routing._apply`).

:meth:`Router.route_bulk` does the per-key part in bulk: the templates of all keys in one
pass, and for a template whose base decision fires no renaming, a route made from string
slices of the key (no regex, no renaming replayed); it returns the routes in natural key
order, sorting by a string per key the template builds (:func:`templates.sort_texts`), and
the claimed keys cut into runs of one group each, from which
:func:`~weightplan.planner.keys.bulk_groups.bulk_group` makes the converter groups.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, compress, groupby, repeat
from operator import itemgetter

from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.core.makers import columns, maker
from weightplan.planner.keys.patterns import PatternMatch, natural_key
from weightplan.planner.keys.bulk_groups import Routed, Run, Token
from weightplan.planner.keys.routing import Route, _apply, _lands, bucket_of
from weightplan.planner.keys.templates import (
    MatchShape, all_blind, sort_texts, sortable, template_of, templates_of,
)
from weightplan.planner.keys.transforms import (
    ConverterMatch, PatternTransform, PrefixChange, Renaming, WeightConverter,
)


_route, _converter_match = maker(Route), maker(ConverterMatch)
_routes, _claims = columns(Route), columns(ConverterMatch)
Made = tuple[list[Route], list[object], list[Run]]  # routes, their idents, their runs


def routed(key: str, renamed: str, fired: tuple[Renaming, ...],
           converter: WeightConverter | None = None, match: ConverterMatch | None = None,
           note: str = "") -> Route:
    """A :class:`Route` (built here, or by :func:`_route` on the fast paths)."""
    if converter is None or match is None:
        converter, match = None, None
    return Route(key, renamed, fired, converter, match, note=note)


@dataclass(frozen=True, slots=True)
class _Decision:
    """What one list of transforms does to every key of one template."""

    matched: tuple[tuple[Renaming, bool], ...]  # renamings that match, and whether they fire
    converter: WeightConverter | None
    shape: MatchShape | None
    landable: bool  # some key of this template may exist in the model


class Applier:
    """:func:`_apply` for one list of transforms, decided once per key template
    (:mod:`templates`): which renamings match, which converter claims the key and where."""

    def __init__(self, renamings: Sequence[Renaming], converters: Sequence[WeightConverter],
                 model_templates: frozenset[str] | None):
        self.renamings, self.converters = tuple(renamings), tuple(converters)
        self.blind = all_blind(self.renamings) and all_blind(self.converters)
        self.model_templates = model_templates
        self.memo: dict[str, _Decision] = {}

    def decision(self, template: str | None) -> _Decision | None:
        if template is None or not self.blind:
            return None
        decided = self.memo.get(template)
        if decided is None:
            decided = self.memo[template] = self._decide(template)
        return decided

    def __call__(self, key: str, decided: _Decision | None) -> Route:
        if decided is None:
            return _apply(key, self.renamings, self.converters)
        name, fired = key, []
        for renaming, fires in decided.matched:
            new = renaming.rename(name)
            if (new is not None) != fires:  # e.g. groups swapped: the template can't tell
                return _apply(key, self.renamings, self.converters)
            if new is not None:
                fired.append(renaming)
                name = new
        if decided.converter is None:
            return routed(key, name, tuple(fired))
        assert decided.shape is not None  # a converter decision always has its match shape
        return routed(key, name, tuple(fired), decided.converter, decided.shape.rebuild(name))

    def _decide(self, template: str) -> _Decision:
        matched, name = [], template
        for r in self.renamings:
            if not isinstance(r, PatternTransform) or r.first_match(name) is not None:
                new = r.rename(name)
                matched.append((r, new is not None))
                name = new if new is not None else name
        for c in self.converters:
            shape = MatchShape.of(c, name)
            if shape is not None:
                route = routed(template, name, (), c, shape.rebuild(name))
                return _Decision(tuple(matched), c, shape, self._landable(route))
        return _Decision(tuple(matched), None, None, self._landable(routed(template, name, ())))

    def _landable(self, route: Route) -> bool:
        return self.model_templates is None or _lands(route, self.model_templates)


class Router:
    """Routes keys with the base-model-prefix fix-ups; each order of transforms has its
    own template memo, and a fix-up no key of the template could land with is skipped."""

    def __init__(self, renamings: list[Renaming], converters: list[WeightConverter],
                 model: ModelInfo | None):
        templates = None if model is None else frozenset(
            t for t in templates_of(list(model.tensors)) if t is not None)
        self.model, self.base = model, Applier(renamings, converters, templates)
        self.landed: dict[tuple, bool] = {}  # by converter group: the same for its members
        self.tokens: dict[object, Token] = {}  # by converter group, of routes made in bulk
        self.viable_fixups: dict[str, list] = {}  # by template
        self.fixups: list[tuple[PrefixChange, str, Applier]] = []
        prefix = model.base_model_prefix if model is not None else None
        for fix in (PrefixChange(prefix_to_remove=prefix), PrefixChange(prefix_to_add=prefix)
                    ) if prefix else ():
            verb = "removed" if fix.prefix_to_remove else "added"
            for order, when in (([*renamings, fix], "after"), ([fix, *renamings], "before")):
                note = f"base_model_prefix {prefix!r} {verb} {when} the renamings"
                self.fixups.append((fix, note, Applier(order, converters, templates)))

    def route_all(self, keys: Iterable[str]) -> list[Route]:
        """Every key's route, in natural key order (:func:`natural_key`)."""
        return self.route_bulk(keys).routes

    def route_bulk(self, keys: Iterable[str]) -> Routed:
        """:meth:`route_all`, with what :func:`~.bulk_groups.bulk_group` needs: the keys of
        a template are routed together (:meth:`_maker`), in string order (within one
        template, the natural one), and sorted by a string per key the template builds
        (:func:`templates.sort_texts`)."""
        keys = list(keys)
        templates = templates_of(keys)
        by_template: dict[str | None, list[str]] = {}
        for key, template in zip(keys, templates, strict=True):
            try:  # (a template seen before, the usual case, costs no get() call)
                by_template[template].append(key)
            except KeyError:
                by_template[template] = [key]
        if not sortable(keys, templates):
            # (a template's keys in string order, as _claims_maker takes them; ties of
            # natural_key are between templates, or among keys without one: kept in order)
            routes = [r for t, m in by_template.items()
                      for r in self._maker(t)(m if t is None else sorted(m))[0]]
            return Routed(sorted(routes, key=lambda r: natural_key(r.key)), None, [])
        made: list[Route] = []
        idents: list[object] = []
        runs: list[Run] = []
        texts: list[str] = []
        for template, members in by_template.items():
            assert template is not None  # sortable: every key has a template
            members.sort()
            routes, ident, cut = self._maker(template)(members)
            made += routes
            idents += ident
            runs += cut
            texts += sort_texts(template, members)
        order = sorted(range(len(made)), key=texts.__getitem__)
        return Routed(list(map(made.__getitem__, order)), list(map(idents.__getitem__, order)),
                      runs)

    def _maker(self, template: str | None) -> Callable[[list[str]], Made]:
        """How the keys of ``template`` are routed: :meth:`route` each, or, where the base
        decision fires no renaming, routes built from the keys alone (:meth:`route` for a
        key that doesn't land, so it gets the fix-ups)."""
        decided = self.base.decision(template)
        if template is None or decided is None or decided.matched:
            return lambda keys: _each(list(map(self.route, keys)))
        tensors = self.model.tensors if self.model is not None else None
        if decided.converter is None:
            def plain(keys: list[str]) -> Made:
                return _each([_route(key, key, (), None, None, "")
                              if tensors is None or key in tensors else self.route(key)
                              for key in keys])
            return plain
        assert decided.shape is not None  # a converter decision always has its match shape
        return _claims_maker(template, decided.converter, decided.shape, self)

    def token(self, converter: WeightConverter, route: Route) -> Token:
        """The :class:`Token` of the group of ``route``, which ``converter`` claimed."""
        ident = bucket_of(route)
        found = self.tokens.get(ident)
        if found is None:
            found = self.tokens[ident] = Token(converter, ident)
        return found

    def route(self, key: str) -> Route:
        template = template_of(key)
        route = self.base(key, self.base.decision(template))
        model = self.model
        if model is None or self.lands(route):
            return route
        for fix, note, applier, decided in self.viable(template):
            fixed = applier(key, decided)
            if fix in fixed.fired and self.lands(fixed):
                return Route(fixed.key, fixed.renamed, fixed.fired, fixed.converter, fixed.claim,
                             note=note)
        if key in model and (route.fired or route.converter):
            return routed(key, key, (), note="kept its checkpoint name: the transformed name "
                                             "is not in the model but the original is")
        return route

    def lands(self, route: Route) -> bool:
        """:func:`routing._lands`, once per converter group (256 experts ask once)."""
        assert self.model is not None  # only asked when routing against a model
        if route.converter is None:
            return route.renamed in self.model
        m = route.match
        ident = (id(route.converter), m.head, m.tail, m.match.groups)  # hashing it is slow
        landed = self.landed.get(ident)
        if landed is None:
            landed = self.landed[ident] = _lands(route, self.model)
        return landed

    def viable(self, template: str | None) -> list:
        """The fix-ups worth replaying for keys of ``template``: the prefix change fires
        and some key of the template may land (all of them without a template)."""
        found = self.viable_fixups.get(template) if template is not None else None
        if found is None:
            found = []
            for fix, note, applier in self.fixups:
                decided = applier.decision(template)
                if decided is None or (decided.landable and any(
                        r == fix and fires for r, fires in decided.matched)):
                    found.append((fix, note, applier, decided))
            if template is not None:
                self.viable_fixups[template] = found
        return found


def _claims_maker(template: str, converter: WeightConverter, shape: MatchShape,
                  router: Router) -> Callable[[list[str]], Made]:
    """Routes the keys of ``template`` that ``converter`` claims with no renaming fired,
    all at once: the match is sliced out of each key (:class:`MatchShape`), with one
    :class:`PatternMatch` per index and groups; whether a group lands is asked once per
    head, tail and groups (:meth:`Router.route` takes a key whose group doesn't). The
    keys come in string order."""
    start, end, spans = shape.start, shape.end, shape.group_spans
    at = itemgetter(slice(*shape.index_span)) if shape.index_span is not None else None
    head_of = itemgetter(slice(None, start))
    fixed_tail = sys.intern(template[end:]) if "1" not in template[end:] else None
    span, source_index = (start - shape.scope, end - shape.scope), shape.source_index
    # keys of one template differ only in their digits: with none after the match and none
    # in it but the index's, a group is a head, its keys are consecutive and differ only in
    # their index (:func:`_head_runs`)
    by_head = not spans and fixed_tail is not None
    only_index = by_head and at is not None and shape.index_span is not None and "1" not in (
        template[start:shape.index_span[0]] + template[shape.index_span[1]:end])

    def make_all(keys: list[str]) -> Made:
        count = len(keys)
        heads_at = _head_runs(keys, head_of) if by_head else None
        seen: list  # what tells matches apart: the indices, with the groups if any
        made: dict[object, PatternMatch]
        combos: list  # what tells groups apart: the heads, unless more can differ
        if heads_at is not None:
            heads: list[str] = list(chain.from_iterable(
                repeat(h, stop - begin) for h, begin, stop in heads_at))
            indices = _run_indices(keys, at, heads_at, only_index)
            seen, tails, combos = indices, [fixed_tail] * count, heads
            made = {i: PatternMatch(*span, i, ()) for i in set(indices)}
        else:
            indices = list(map(int, map(at, keys))) if at else [None] * count
            heads = list(map(sys.intern, map(head_of, keys)))
            groups: list[tuple] = ([tuple([None if s is None else k[s[0]:s[1]] for s in spans])
                                    for k in keys] if spans else [()] * count)
            seen = list(zip(indices, groups, strict=True))
            made = {one: PatternMatch(*span, *one) for one in set(seen)}
            tails = ([sys.intern(k[end:]) for k in keys] if fixed_tail is None
                     else [fixed_tail] * count)
            combos = list(zip(heads, tails, groups, strict=True))
        claims = _claims(count, repeat(source_index), heads, tails, map(made.__getitem__, seen))
        routes = _routes(count, keys, keys, repeat(()), repeat(converter), claims, repeat(""))
        return _grouped(routes, keys, indices, combos, heads_at, (source_index, template,
                                                                   converter, router))

    return make_all


def _grouped(routes: list[Route], keys: list[str], indices: list[int | None], combos: list,
             heads_at: list[tuple[str, int, int]] | None,
             how: tuple[int, str, WeightConverter, Router]) -> Made:
    """:meth:`Router.route`'s routes of ``keys`` from the ones made in bulk, the idents of
    their groups and their runs (``combos``: each key's group; ``heads_at``: the groups
    as heads with the bounds of their keys, when that is what they are)."""
    source_index, template, converter, router = how
    if heads_at is None:
        firsts: dict = dict(zip(combos, routes, strict=True))  # one route per group asks
    else:
        firsts = {head: routes[begin] for head, begin, _ in heads_at}
    fast = _fast_combos(firsts, keys, template, router)
    tokens = {c: router.token(converter, r) for c, r in firsts.items() if fast[c]}
    if len(tokens) == len(firsts) and heads_at is not None:
        runs = [Run(tokens[head], source_index, routes[begin:stop], keys[begin:stop],
                    indices[begin:stop]) for head, begin, stop in heads_at]
        idents: list[object] = list(chain.from_iterable(
            repeat(run.token, len(run.keys)) for run in runs))
        return routes, idents, runs
    if len(tokens) == len(firsts):
        idents = list(map(tokens.__getitem__, combos))
        return routes, idents, _runs(idents, source_index, routes, keys, indices)
    keep = list(map(fast.__getitem__, combos))
    slow = [r if ok else router.route(r.key) for r, ok in zip(routes, keep, strict=True)]
    idents = [tokens[c] if ok else bucket_of(r)
              for c, r, ok in zip(combos, slow, keep, strict=True)]
    runs = _runs(list(compress(idents, keep)), source_index, list(compress(routes, keep)),
                 list(compress(keys, keep)), list(compress(indices, keep)))
    return slow, idents, runs


def _head_runs(keys: list[str], head_of: Callable[[str], str]
               ) -> list[tuple[str, int, int]] | None:
    """Each head of ``keys`` (in string order, so a head's keys are consecutive), interned,
    with the bounds of its keys: found by bisection, a few steps per head rather than a
    slice per key. ``None`` when heads are too many for that to pay."""
    runs: list[tuple[str, int, int]] = []
    begin, count = 0, len(keys)
    while begin < count:
        if len(runs) > count >> 3:
            return None
        head = sys.intern(head_of(keys[begin]))
        stop = bisect_right(keys, head, begin + 1, count, key=head_of)
        runs.append((head, begin, stop))
        begin = stop
    return runs


def _run_indices(keys: list[str], at: Callable[[str], str] | None,
                 heads_at: list[tuple[str, int, int]], only_index: bool) -> list[int | None]:
    """Each key's index: where a head's keys differ only in it (``only_index``), they rise
    one by one when the last is the first plus their count less one (a stack of experts):
    the keys of one template write their numbers with the same count of digits, so their
    string order is the indices' order, and distinct indices so spread are consecutive."""
    if at is None:
        return [None] * len(keys)
    indices: list[int | None] = []
    for _, begin, stop in heads_at:
        first, last = int(at(keys[begin])), int(at(keys[stop - 1]))
        if only_index and last - first == stop - begin - 1:
            indices += range(first, last + 1)
        else:
            indices += map(int, map(at, keys[begin:stop]))
    return indices


def _fast_combos(firsts: dict[object, Route], keys: list[str], template: str, router: Router
                 ) -> dict[object, bool]:
    """Per group (head, tail, groups) of one template's claimed keys: whether
    :meth:`Router.route` keeps the route made in bulk for each of its keys. It does where
    the group lands; where it doesn't, if no fix-up is worth replaying for the template
    and no key of it is a model key (which would keep its checkpoint name)."""
    model = router.model
    if model is None:
        return dict.fromkeys(firsts, True)
    lands = {c: router.lands(r) for c, r in firsts.items()}
    if (all(lands.values()) or router.viable(template)
            or any(map(model.tensors.__contains__, keys))):
        return lands
    return dict.fromkeys(firsts, True)


def _runs(idents: list[object], source_index: int, routes: list[Route], keys: list[str],
          indices: list[int | None]) -> list[Run]:
    """The keys cut where their group changes (``idents``: all tokens, in key order)."""
    runs, start = [], 0
    for token, same in groupby(idents):
        stop = start + len(list(same))
        assert isinstance(token, Token)  # only keys routed in bulk come in runs
        runs.append(Run(token, source_index, routes[start:stop], keys[start:stop],
                        indices[start:stop]))
        start = stop
    return runs


def _each(routes: list[Route]) -> Made:
    return routes, list(map(bucket_of, routes)), []
