"""Routing at frontier scale: each key *template* is routed once (:mod:`templates`).

:func:`~weightplan.planner.keys.routing.route_checkpoint` routes every key through a
:class:`Router`: per list of transforms (the mapping, and the four base-model-prefix
fix-up orders) an :class:`Applier` decides once per template which renamings match and
which converter claims the key and where; each real key then replays only those
renamings and slices its match out of the converter's spans. A fix-up none of whose
template's keys could land in the model (its target's template is not a model key's
template) is skipped without replaying. Transforms that can tell digits apart, and keys
with leading zeros, take the plain per-key path (:func:`routing._apply`).

:meth:`Router.route_all` does the per-key part in bulk: the templates of all keys in one
pass, and for a template whose base decision fires no renaming, a route made from string
slices of the key (no regex, no renaming replayed); it also returns the routes in natural
key order, sorting by a string per key the template builds (:func:`templates.sort_text`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter

from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.makers import columns, maker
from weightplan.planner.keys.patterns import PatternMatch, natural_key
from weightplan.planner.keys.routing import Route, _apply, _lands
from weightplan.planner.keys.templates import (
    MatchShape, all_blind, sort_text, sortable, template_of, templates_of,
)
from weightplan.planner.keys.transforms import (
    ConverterMatch, PatternTransform, PrefixChange, Renaming, WeightConverter,
)


_route, _converter_match = maker(Route), maker(ConverterMatch)
_routes, _claims = columns(Route), columns(ConverterMatch)


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
            t for t in map(template_of, model.tensors) if t is not None)
        self.model, self.base = model, Applier(renamings, converters, templates)
        self.landed: dict[tuple, bool] = {}  # by converter group: the same for its members
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
        """Every key's route, in natural key order (:func:`natural_key`); the keys of a
        template are routed together (:meth:`_maker`), where its base decision fires no
        renaming from string slices of the keys (:func:`_claims_maker`)."""
        keys = list(keys)
        templates = templates_of(keys)
        fast_sort = sortable(keys, templates)
        by_template: dict[str | None, list[str]] = {}
        for key, template in zip(keys, templates, strict=True):
            found = by_template.get(template)
            if found is None:
                by_template[template] = [key]
            else:
                found.append(key)
        routes: list[Route] = []
        texts: list[str] = []
        for template, members in by_template.items():
            routes += self._maker(template)(members)
            if fast_sort:
                assert template is not None  # sortable: every key has a template
                texts += map(sort_text(template), members)
        if not fast_sort:
            return sorted(routes, key=lambda r: natural_key(r.key))
        return [routes[i] for i in sorted(range(len(routes)), key=texts.__getitem__)]

    def _maker(self, template: str | None) -> Callable[[list[str]], list[Route]]:
        """How the keys of ``template`` are routed: :meth:`route` each, or, where the base
        decision fires no renaming, routes built from the keys alone (:meth:`route` for a
        key that doesn't land, so it gets the fix-ups)."""
        decided = self.base.decision(template)
        if template is None or decided is None or decided.matched:
            return lambda keys: list(map(self.route, keys))
        tensors = self.model.tensors if self.model is not None else None
        if decided.converter is None:
            def plain(keys: list[str]) -> list[Route]:
                return [_route(key, key, (), None, None, "")
                        if tensors is None or key in tensors else self.route(key)
                        for key in keys]
            return plain
        assert decided.shape is not None  # a converter decision always has its match shape
        return _claims_maker(template, decided.converter, decided.shape, self)

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
                  router: Router) -> Callable[[list[str]], list[Route]]:
    """Routes the keys of ``template`` that ``converter`` claims with no renaming fired,
    all at once: the match is sliced out of each key (:class:`MatchShape`), with one
    :class:`PatternMatch` per index and groups; whether a group lands is asked once per
    head, tail and groups (:meth:`Router.route` takes a key whose group doesn't)."""
    start, end, spans = shape.start, shape.end, shape.group_spans
    at = itemgetter(slice(*shape.index_span)) if shape.index_span is not None else None
    head_of = itemgetter(slice(None, start))
    fixed_tail = sys.intern(template[end:]) if "1" not in template[end:] else None
    span, source_index, model = (start - shape.scope, end - shape.scope), shape.source_index, router.model

    def make_all(keys: list[str]) -> list[Route]:
        count = len(keys)
        indices: list[int | None] = list(map(int, map(at, keys))) if at else [None] * count
        groups: list[tuple] = ([tuple([None if s is None else k[s[0]:s[1]] for s in spans])
                                for k in keys] if spans else [()] * count)
        seen = list(zip(indices, groups, strict=True))
        made = {one: PatternMatch(*span, *one) for one in set(seen)}
        heads = list(map(sys.intern, map(head_of, keys)))
        tails: list[str] = ([fixed_tail] * count if fixed_tail is not None
                            else [sys.intern(k[end:]) for k in keys])
        claims = _claims(count, repeat(source_index), heads, tails, map(made.__getitem__, seen))
        routes = _routes(count, keys, keys, repeat(()), repeat(converter), claims, repeat(""))
        if model is None:
            return routes
        combos = list(zip(heads, tails, groups, strict=True))
        # one route per (head, tail, groups) asks; every key of it lands alike
        lands = {c: router.lands(r) for c, r in dict(zip(combos, routes, strict=True)).items()}
        if all(lands.values()):
            return routes
        return [r if lands[c] else router.route(r.key) for r, c in zip(routes, combos, strict=True)]

    return make_all
