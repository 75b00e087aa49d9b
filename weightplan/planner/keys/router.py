"""Routing at frontier scale: each key *template* is routed once (:mod:`templates`).

:func:`~weightplan.planner.keys.routing.route_checkpoint` routes every key through a
:class:`Router`: per list of transforms (the mapping, and the four base-model-prefix
fix-up orders) an :class:`Applier` decides once per template which renamings match and
which converter claims the key and where; each real key then replays only those
renamings and slices its match out of the converter's spans. A fix-up none of whose
template's keys could land in the model (its target's template is not a model key's
template) is skipped without replaying. Transforms that can tell digits apart, and keys
with leading zeros, take the plain per-key path (:func:`routing._apply`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.keys.routing import Claim, Route, _apply, _lands
from weightplan.planner.keys.templates import MatchShape, all_blind, template_of
from weightplan.planner.keys.transforms import (
    ConverterMatch, PatternTransform, PrefixChange, Renaming, WeightConverter,
)


def routed(key: str, renamed: str, fired: tuple[Renaming, ...],
           converter: WeightConverter | None = None, match: ConverterMatch | None = None,
           note: str = "") -> Route:
    """A :class:`Route` (the one place this module builds them)."""
    claim = Claim(converter, match) if converter is not None and match is not None else None
    return Route(key, renamed, fired, claim, note=note)


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

    def route(self, key: str) -> Route:
        template = template_of(key)
        route = self.base(key, self.base.decision(template))
        model = self.model
        if model is None or self.lands(route):
            return route
        for fix, note, applier, decided in self.viable(template):
            fixed = applier(key, decided)
            if fix in fixed.fired and self.lands(fixed):
                return Route(fixed.key, fixed.renamed, fixed.fired, fixed.claim, note=note)
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
        ident = (route.converter, m.head, m.tail, m.match.groups)
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
