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

from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.makers import maker
from weightplan.planner.keys.patterns import PatternMatch, natural_key
from weightplan.planner.keys.routing import Route, _apply, _lands
from weightplan.planner.keys.templates import (
    MatchShape, all_blind, sort_text, sortable, template_of, templates_of,
)
from weightplan.planner.keys.transforms import (
    ConverterMatch, PatternTransform, PrefixChange, Renaming, WeightConverter,
)


_route, _converter_match = maker(Route), maker(ConverterMatch)


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
        """Every key's route, in natural key order (:func:`natural_key`); keys of a
        template whose base decision fires no renaming take a fast path (:meth:`_maker`)."""
        keys = list(keys)
        templates = templates_of(keys)
        fast_sort = sortable(keys, templates)
        per: dict[str | None, tuple[Callable[[str], Route], Callable[[str], str] | None]] = {}
        routes, texts = [], []
        for key, template in zip(keys, templates, strict=True):
            found = per.get(template)
            if found is None:
                found = per[template] = (self._maker(template),
                                         sort_text(template) if fast_sort and template is not None else None)
            route, text = found
            routes.append(route(key))
            if text is not None:
                texts.append(text(key))
        if not fast_sort:
            return sorted(routes, key=lambda r: natural_key(r.key))
        return [routes[i] for i in sorted(range(len(routes)), key=texts.__getitem__)]

    def _maker(self, template: str | None) -> Callable[[str], Route]:
        """How a key of ``template`` is routed: :meth:`route`, or, where the base decision
        fires no renaming, a route built from the key alone (:meth:`route` for a key that
        doesn't land, so it gets the fix-ups)."""
        decided = self.base.decision(template)
        if template is None or decided is None or decided.matched:
            return self.route
        tensors = self.model.tensors if self.model is not None else None
        if decided.converter is None:
            def plain(key: str) -> Route:
                if tensors is None or key in tensors:
                    return _route(key, key, (), None, None, "")
                return self.route(key)
            return plain
        assert decided.shape is not None  # a converter decision always has its match shape
        return _claim_maker(template, decided.converter, decided.shape, self)

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


def _claim_maker(template: str, converter: WeightConverter, shape: MatchShape,
                 router: Router) -> Callable[[str], Route]:
    """Routes the keys of ``template`` that ``converter`` claims with no renaming fired:
    the match is sliced out of the key (:class:`MatchShape`), with one
    :class:`PatternMatch` per index and groups; whether a group lands is asked once per
    head, tail and groups (:meth:`Router.route` takes a key whose group doesn't)."""
    start, end, source_index, spans = shape.start, shape.end, shape.source_index, shape.group_spans
    at = slice(*shape.index_span) if shape.index_span is not None else None
    fixed_tail = sys.intern(template[end:]) if "1" not in template[end:] else None
    matches: dict[object, PatternMatch] = {}
    landed: dict[tuple, bool] = {}
    model = router.model

    def make(key: str) -> Route:
        index = int(key[at]) if at is not None else None
        groups = tuple([None if s is None else key[s[0]:s[1]] for s in spans]) if spans else ()
        seen = (index, groups) if spans else index
        match = matches.get(seen)
        if match is None:
            match = matches[seen] = PatternMatch(start - shape.scope, end - shape.scope, index,
                                                 groups)
        head = sys.intern(key[:start])
        tail = fixed_tail if fixed_tail is not None else sys.intern(key[end:])
        route = _route(key, key, (), converter,
                       _converter_match(source_index, head, tail, match), "")
        if model is None:
            return route
        lands = landed.get((head, tail, groups))
        if lands is None:
            lands = landed[(head, tail, groups)] = router.lands(route)
        return route if lands else router.route(key)

    return make
