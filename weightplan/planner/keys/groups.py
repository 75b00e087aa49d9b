"""Routes grouped by converter: each :class:`~.routing.Group` and :class:`~.routing.Incomplete`.

A claimed route's group is its converter with the surroundings of its match
(:func:`~.routing.bucket_of`); per source pattern of the converter, the group's routes
make one input stream, ordered by their index wildcard. A plain route is a group of its
own. The router hands the claimed routes over in :class:`~.applier.Run`\\ s (routes of
one group and source that came together), so a stream is ordered run by run: its runs
sorted by their first index, their indices joined. Where that is not ``0..n-1`` (runs
that interleave, a gap, a repeat) :func:`_ordered` sorts the stream's routes one by one,
and names the gap or the repeat. Groups come in the order of their first key (natural
order), and the first bad group in that order raises.

A converter whose sources are all ``()`` per-tensor scales (:data:`PER_TENSOR`: ModelOpt's
``weight_scale_2``, …) merges them like their weights: as the ``(1,)`` per-tensor grid
compressed-tensors stores (:func:`as_grids`: ``Reshape((1,))`` first), so E experts
stack to ``(E, 1)`` and gate/up concatenate along the output dim to ``(E, 2)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from itertools import chain
from operator import itemgetter

from weightplan.errors import ConflictingTransformError, IndexGapError
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.keys.applier import Run
from weightplan.planner.keys.router import Routed
from weightplan.planner.keys.routing import Group, Incomplete, Route
from weightplan.planner.keys.transforms import WeightConverter


class _Natural:
    """Each key's position in natural order, worked out when first asked: only incomplete
    groups and errors ask (they name keys in that order)."""

    def __init__(self, routes: Sequence[Route]):
        self.routes = routes
        self.at: dict[str, int] = {}

    def sorted(self, keys: Iterable[str]) -> list[str]:
        if not self.at:
            self.at = {r.key: i for i, r in enumerate(self.routes)}
        return sorted(keys, key=self.at.__getitem__)


def group_routes(routed: Routed, entries: Mapping[str, TensorEntry]
                 ) -> tuple[tuple[Group, ...], tuple[Incomplete, ...]]:
    """The groups of ``routed``'s routes, and the converter groups lacking a source pattern.

    Raises:
        IndexGapError: a stream's indices have a gap or a repeat, or two streams of one
            group collected different counts.
        ConflictingTransformError: a source without an index wildcard matched several keys
            of one group.
    """
    streams: dict[object, list[list[Run]]] = {}
    for run in routed.runs:
        found = streams.get(run.ident)
        if found is None:
            found = streams[run.ident] = [[] for _ in _converter(run.routes[0]).sources]
        found[run.source_index].append(run)
    natural = _Natural(routed.routes)
    groups: list[Group] = []
    incomplete: list[Incomplete] = []
    for ident, route in dict(zip(routed.idents, routed.routes, strict=True)).items():
        if route.converter is None:  # (its group's first route is its only one)
            groups.append(Group(None, ((entries[route.key],),), ((route,),), (route.renamed,)))
            continue
        made = _converter_group(route, streams[ident], entries, natural)
        if isinstance(made, Group):
            groups.append(made)
        else:
            incomplete.append(made)
    return tuple(groups), tuple(incomplete)


def _converter_group(route: Route, streams: list[list[Run]], entries: Mapping[str, TensorEntry],
                     natural: _Natural) -> Group | Incomplete:
    """The group of ``route`` (any of its routes), from its streams' runs."""
    converter = _converter(route)
    targets = converter.target_keys(route.match)
    missing = tuple(p for p, runs in zip(converter.source_patterns, streams, strict=True)
                    if not runs)
    if missing:
        present = natural.sorted(k for runs in streams for run in runs for k in run.keys)
        return Incomplete(converter, targets, tuple(present), missing)
    ordered = [_ordered(converter, pattern, source.has_index, runs, targets, entries, natural)
               for pattern, source, runs in zip(converter.source_patterns, converter.sources,
                                                streams, strict=True)]
    _check_counts(converter, [routes for routes, _ in ordered], targets)
    sources = tuple(itemgetter(*keys)(entries) if len(keys) > 1 else (entries[keys[0]],)
                    for _, keys in ordered)
    return as_grids(Group(converter, sources, tuple(tuple(routes) for routes, _ in ordered),
                          targets))


# the stored names of per-tensor scales (one value for the whole weight)
PER_TENSOR = (".weight_scale_2", ".weight_global_scale", ".input_scale", ".input_global_scale",
              ".weight_scale")


def per_tensor(group: Group, shapes: tuple[tuple[int, ...], ...] = ((),)) -> bool:
    """Whether ``group`` is a converter's over per-tensor scales of ``shapes`` only."""
    return group.converter is not None and all(
        e.spec.shape in shapes and e.key.endswith(PER_TENSOR) for e in group.entries)


def as_grids(group: Group) -> Group:
    """``group``, its ``()`` per-tensor scales taken as ``(1,)`` grids by the converter
    (see the module docstring)."""
    if group.converter is None or group.sources[0][0].spec.shape or not per_tensor(group):
        return group
    from weightplan.planner.core.ops.layout import Reshape

    return replace(group, converter=replace(
        group.converter, operations=(Reshape((1,)), *group.converter.operations)))


def _converter(route: Route) -> WeightConverter:
    assert route.converter is not None, route.key  # only claimed routes come in runs
    return route.converter


def _ordered(converter: WeightConverter, pattern: str, has_index: bool, runs: list[Run],
             targets: tuple[str, ...], entries: Mapping[str, TensorEntry], natural: _Natural
             ) -> tuple[list[Route], list[str]]:
    """One stream's routes and keys, by index: run by run where their indices, joined,
    are ``0..n-1``; else one by one (and then a gap or a repeat raises)."""
    if len(runs) > 1:
        runs = sorted(runs, key=_first_index)
    routes = list(chain.from_iterable(run.routes for run in runs))
    keys = list(chain.from_iterable(run.keys for run in runs))
    if not has_index:
        if len(keys) > 1:
            raise ConflictingTransformError(
                f"{converter.describe()}: source {pattern!r} matched several keys for one "
                f"group ({', '.join(natural.sorted(keys))}); anchor the pattern or use `*`")
        return routes, keys
    if list(chain.from_iterable(run.indices for run in runs)) == list(range(len(keys))):
        return routes, keys
    routes.sort(key=_index)  # (distinct indices: the order they were in doesn't matter)
    if list(map(_index, routes)) != list(range(len(routes))):
        raise _gap(converter, pattern, natural.sorted(keys), targets, entries, routes)
    return routes, [r.key for r in routes]


def _gap(converter: WeightConverter, pattern: str, keys: list[str], targets: tuple[str, ...],
         entries: Mapping[str, TensorEntry], routes: list[Route]) -> IndexGapError:
    """The error for a stream whose indices aren't ``0..n-1`` (``keys``: in natural order)."""
    by_key = {r.key: r for r in routes}
    stream = sorted(map(by_key.__getitem__, keys), key=_index)  # (stable: the first key near)
    indices = list(map(_index, stream))
    present = set(indices)
    gaps = [i for i in range(max(indices) + 1) if i not in present]
    dupes = sorted({i for i in indices if indices.count(i) > 1})
    what = f"indices {gaps} are missing" if gaps else f"indices {dupes} appear twice"
    near = stream[0].key
    return IndexGapError(f"{converter.describe()}: for {targets[0]}, source {pattern!r} "
                         f"collected {len(indices)} tensors but {what} (e.g. near {near} in "
                         f"{entries[near].file or '<memory>'})")


def _check_counts(converter: WeightConverter, ordered: list[list[Route]],
                  targets: tuple[str, ...]) -> None:
    counts = {len(s) for s, src in zip(ordered, converter.sources, strict=True) if src.has_index}
    if len(counts) > 1:
        sizes = {p: len(s) for p, s in zip(converter.source_patterns, ordered, strict=True)}
        raise IndexGapError(f"{converter.describe()}: for {targets[0]} the source patterns "
                            f"collected different counts {sizes}; an index is missing")


def _index(route: Route) -> int:
    index = route.match.match.index
    assert index is not None, route.key  # only sources with an index wildcard are ordered
    return index


def _first_index(run: Run) -> int:
    first = run.indices[0]
    return -1 if first is None else first
