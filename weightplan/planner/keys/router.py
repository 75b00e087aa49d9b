"""Routing every key of a checkpoint: one :class:`~.applier.Batch` per key template,
with the base-model-prefix fix-ups, in natural key order.

The keys are sorted into their templates (:func:`~.templates.templates_of`) and each
template's keys are routed together, in string order (within a template, the natural
one), by the mapping's :class:`~.applier.Applier`; the keys alone in their template and
those without one form one batch, routed without a decision (it would not be reused:
:meth:`~.applier.Applier.each`).
The routes are then put in natural key order (:func:`~.templates.natural_order`, batch by
batch).
When a model is known, a key whose route doesn't land (:func:`~.applier.lands`) tries the
fix-ups in turn: the model's ``base_model_prefix`` removed, then added, each after and
then before the renamings, each with its own applier; the first whose route fires the
prefix change and lands is taken (noted), with the key the model's own checkpoint would
hold (``saved_as``: what a save writes). A key none of them lands keeps its checkpoint
name when that is a model key and the mapping changed it (noted). Fix-ups are tried only
for templates where one may land (:meth:`Router.viable`) or some key is a model key.
A key that is a model key is routed without the :data:`~.transforms.LEGACY` renamings
(noted): they are for other models' old checkpoints, not for a parameter really named
``weight_g`` or a model whose own names hold ``.model.model``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from operator import not_
from typing import cast

from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.keys.applier import Applier, Batch, Decision, Run, batch_of, lands
from weightplan.planner.keys.routing import Route, bucket_of
from weightplan.planner.keys.templates import coarse, natural_order, templates_of
from weightplan.planner.keys.transforms import LEGACY, PrefixChange, Renaming, WeightConverter

_KEPT = "kept its checkpoint name: the transformed name is not in the model but the original is"
_OWN = "a model key: the legacy renames left it as it is"


@dataclass(frozen=True, slots=True)
class Routed:
    """Every key's route and its group's ident, in natural key order; the claimed routes
    in runs (in no particular order)."""

    routes: list[Route]
    idents: list[object]
    runs: list[Run]


@dataclass(frozen=True, slots=True)
class _Fixup:
    fix: PrefixChange
    note: str
    applier: Applier


class Router:
    """Routes keys with the base-model-prefix fix-ups; each order of transforms has its
    own applier (and template memo)."""

    def __init__(self, renamings: list[Renaming], converters: list[WeightConverter],
                 model: ModelInfo | None):
        templates = None if model is None else frozenset(map(coarse, model.tensors))
        self.model, self.base = model, Applier(renamings, converters, templates)
        modern = [r for r in renamings if r not in LEGACY]  # (for keys the model has)
        self.modern = Applier(modern, converters, templates) if len(modern) < len(renamings) \
            else None
        self.landed: dict[object, bool] = {}  # by converter group: the same for its members
        self.viable_fixups: dict[str | None, list[tuple[_Fixup, Decision | None]]] = {}
        self.fixups: list[_Fixup] = []
        prefix = model.base_model_prefix if model is not None else None
        for fix in (PrefixChange(prefix_to_remove=prefix), PrefixChange(prefix_to_add=prefix)
                    ) if prefix else ():
            verb = "removed" if fix.prefix_to_remove else "added"
            for order, when in (([*renamings, fix], "after"), ([fix, *renamings], "before")):
                note = f"base_model_prefix {prefix!r} {verb} {when} the renamings"
                self.fixups.append(_Fixup(fix, note, Applier(order, converters, templates)))

    def route_all(self, keys: list[str]) -> Routed:
        """Every key's route, in natural key order (:func:`~.patterns.natural_key`)."""
        by_template: dict[str | None, list[str]] = {}
        for key, template in zip(keys, templates_of(keys), strict=True):
            members = by_template.get(template)
            if members is None:
                by_template[template] = [key]
            else:
                members.append(key)
        for template, members in by_template.items():
            if template is not None:
                members.sort()
        # (deciding once per template pays where the decision is reused: the keys alone in
        # their template, and those without one, are routed key by key, in one batch)
        shared: list[tuple[str | None, list[str]]] = [
            (t, m) for t, m in by_template.items() if t is not None and len(m) > 1]
        alone = [(t, m) for t, m in by_template.items() if t is None or len(m) == 1]
        routes: list[Route] = []
        idents: list[object] = []
        runs: list[Run] = []
        batches = list(shared)
        if alone:
            batches.append((None, [k for _, m in alone for k in m]))
        for template, members in batches:
            made = self.batch(template, members)
            routes += made.routes
            idents += made.idents
            runs += made.runs
        order = natural_order(batches)
        return Routed(list(map(routes.__getitem__, order)), list(map(idents.__getitem__, order)),
                      runs)

    def batch(self, template: str | None, keys: list[str]) -> Batch:
        """The routes of ``keys`` (all of ``template``), fixed up where they don't land."""
        made = self.base.batch(keys, self.base.decision(template))
        model = self.model
        if model is None:
            return made
        viable = self.viable(template)
        if not viable and not any(map(model.tensors.__contains__, keys)):
            return made  # no fix-up can land and no key keeps its name: nothing changes
        routes = list(made.routes)
        changed = self.own_names(keys, routes)
        pending = list(compress(range(len(keys)), map(not_, map(self.lands, routes))))
        for fixup, decided in viable:
            if not pending:
                break
            tried = fixup.applier.batch([keys[i] for i in pending], decided).routes
            taken = [fixup.fix in r.fired and self.lands(r) for r in tried]
            fixed = list(compress(zip(pending, tried, strict=True), taken))
            for (i, r), own in zip(fixed, self.saved_as(fixup.fix, template, fixed),
                                   strict=True):
                routes[i] = Route(r.key, r.renamed, r.fired, r.converter, r.claim,
                                  note=fixup.note, saved_as=own)
                changed = True
            pending = list(compress(pending, map(not_, taken)))
        for i in pending:
            if keys[i] in model and (routes[i].fired or routes[i].converter):
                routes[i] = Route(keys[i], keys[i], (), note=_KEPT)
                changed = True
        return batch_of(routes) if changed else made

    def own_names(self, keys: list[str], routes: list[Route]) -> bool:
        """Route again, without the legacy renamings, each of ``keys`` that is a model key
        and that one of them renamed; whether any was."""
        assert self.model is not None  # only asked when routing against a model
        model, modern = self.model, self.modern
        if modern is None:
            return False
        own = [i for i, r in enumerate(routes)
               if r.fired and keys[i] in model and any(f in LEGACY for f in r.fired)]
        for i, r in zip(own, modern.each([keys[i] for i in own]), strict=True):
            routes[i] = Route(r.key, r.renamed, r.fired, r.converter, r.claim, note=_OWN)
        return bool(own)

    def saved_as(self, fix: PrefixChange, template: str | None,
                 fixed: list[tuple[int, Route]]) -> list[str | None]:
        """Each fixed route's key as the model's own checkpoint holds it: the prefix
        change made on the checkpoint's key, where the mapping alone routes that key as
        the fix-up routed the checkpoint's (``None`` where it doesn't: saved as it was)."""
        owns = [fix.rename(r.key) for _, r in fixed]
        if None in owns:  # (a fix-up that fires only after the renamings: key by key)
            return self.saved_inside(fix, fixed)
        mine = cast("list[str]", owns)
        own_template = None if template is None else fix.rename(template)
        again = self.base.batch(mine, self.base.decision(own_template)).routes
        found = [own if (a.key, a.renamed, a.converter) == (own, r.renamed, r.converter)
                 else None for own, a, (_, r) in zip(mine, again, fixed, strict=True)]
        # (not there, and the fix-up ran after the renamings: maybe inside the key)
        later = [pair for pair, own in zip(fixed, found, strict=True) if own is None
                 and len(pair[1].fired) > 1 and pair[1].fired[-1] == fix]
        inside, tried = iter(self.saved_inside(fix, later)), {i for i, _ in later}
        return [next(inside) if own is None and i in tried else own
                for own, (i, _) in zip(found, fixed, strict=True)]

    def saved_inside(self, fix: PrefixChange, fixed: list[tuple[int, Route]]) -> list[str | None]:
        """:meth:`saved_as` of keys the fix-up can't change as they are (it fired after the
        renamings, on a key under a prefix of the checkpoint's own: an adapter file's
        ``base_model.model.``, as peft saves the model's own names under it): the prefix
        component removed (or added) at the first place where the mapping alone then routes
        the key as the fix-up routed it; the place found is tried first for the next key."""
        found: list[str | None] = []
        last: int | None = None
        for _, r in fixed:
            parts = r.key.split(".")
            own = None
            for place in ([last] if last is not None else []) + list(range(len(parts) + 1)):
                candidate = _changed_at(fix, parts, place)
                if candidate is None:
                    continue
                again = self.base.batch([candidate], self.base.decision(None)).routes[0]
                if (again.renamed, again.converter) == (r.renamed, r.converter):
                    own, last = candidate, place
                    break
            found.append(own)
        return found

    def lands(self, route: Route) -> bool:
        """:func:`~.applier.lands` in the model, once per converter group."""
        assert self.model is not None  # only asked when routing against a model
        if route.converter is None:
            return route.renamed in self.model
        ident = bucket_of(route)
        landed = self.landed.get(ident)
        if landed is None:
            landed = self.landed[ident] = lands(route, self.model)
        return landed

    def viable(self, template: str | None) -> list[tuple[_Fixup, Decision | None]]:
        """The fix-ups worth trying for keys of ``template``: the prefix change fires
        and some key of the template may land (all of them without a template)."""
        found = self.viable_fixups.get(template)
        if found is None:
            found = []
            for fixup in self.fixups:
                decided = fixup.applier.decision(template)
                if decided is None or (decided.landable and fixup.fix in decided.fires):
                    found.append((fixup, decided))
            self.viable_fixups[template] = found
        return found


def _changed_at(fix: PrefixChange, parts: list[str], place: int) -> str | None:
    """The key of ``parts`` with ``fix``'s prefix component removed at ``place`` (where it
    is that component), or added there; ``None``: not a change there."""
    if fix.prefix_to_remove is not None:
        if place >= len(parts) or parts[place] != fix.prefix_to_remove:
            return None
        return ".".join(parts[:place] + parts[place + 1:])
    assert fix.prefix_to_add is not None  # (one of the two is set)
    if place < len(parts) and parts[place] == fix.prefix_to_add:
        return None  # (already there: adding is idempotent)
    return ".".join(parts[:place] + [fix.prefix_to_add] + parts[place:])
