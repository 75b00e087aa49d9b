"""Proofs per conversion run: ``verify``'s graph and release invariants, shown for each
conversion's nodes on their own, with one proof of structure shared by every conversion
of one shape (the 58 expert stacks of an FP8 plan are four shapes).

A *run* is a slice of the graph's nodes (``lower`` cuts the graph where its conversions
meet; the cut is only a hint). A run is proven when every input of its nodes is, as the
same object, a node listed earlier in the run. The first run of each shape (its kinds,
attrs types and arities) is proven with a dictionary of its nodes' places; it yields
the places the inputs must be at, and every later run of that shape is proven by
comparing its inputs with its own nodes at those places (tuple comparison: the same
object, or an equal node, as the exact check's sets accept; C-level passes, no hashing).
What structure can't show (specs along the edges, one producer per model tensor) is
checked per node in bulk, as :mod:`verify_bulk` does.

Each function answers ``True`` only when the exact checks in
:mod:`~weightplan.planner.tensors.verify.verify` would find nothing; ``False`` means "not
proven": the exact checks run and word each problem.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, repeat
from operator import attrgetter, is_, itemgetter
from typing import TYPE_CHECKING, Any

from weightplan.planner.tensors.ir.nodes import ATTRS_OF, Node, NodeKind
from weightplan.planner.tensors.verify.verify_bulk import one_producer, specs_hold

if TYPE_CHECKING:
    from weightplan.planner.tensors.lower.placement import Step

_INPUTS, _KIND = attrgetter("inputs"), attrgetter("kind")
_HASH, _SPEC, _ATTRS, _FIRST = (attrgetter("_hash"), attrgetter("spec"), attrgetter("attrs"),
                                itemgetter(0))
Picker = Callable[[Sequence[Any]], tuple[Any, ...]]  # (nodes, or their inputs: by place)


def _picker(places: Sequence[int]) -> Picker:
    """``run`` → the tuple of its nodes at ``places`` (one C call)."""
    if len(places) > 1:
        return itemgetter(*places)
    if places:
        only = places[0]
        return lambda run: (run[only],)
    return lambda run: ()


@dataclass(frozen=True, slots=True)
class RunShape:
    """What one proven run showed, for every run of its kinds, attrs types and arities."""

    classes: tuple[type, ...]
    unfed: int  # the nodes without inputs
    edges: tuple[tuple[int, Picker, tuple[Picker, ...]], ...]  # per arity: its nodes, inputs
    dequantizes: Picker
    weights: Picker  # the dequantizes' first inputs (their weights), in order
    checked: Picker  # the nodes whose specs the per-node check judges (casts, shards, ...)
    sinks: Picker


def shape_of(run: Sequence[Node], arity: dict[NodeKind, int]) -> RunShape | None:
    """The shape of ``run`` when its structure holds (``None``: not proven): inputs earlier
    in the run, (kind, attrs, arity) well formed, every node but the sinks consumed."""
    place = dict(zip(map(id, run), range(len(run)), strict=True))
    inputs = list(map(_INPUTS, run))
    try:
        sources = [[place[id(s)] for s in ins] for ins in inputs]
    except KeyError:  # an input outside the run (or not in the graph at all)
        return None
    if any(s >= i for i, ins in enumerate(sources) for s in ins):
        return None
    kinds, classes = tuple(map(_KIND, run)), tuple(map(type, map(_ATTRS, run)))
    arities = tuple(map(len, inputs))
    for kind, attrs, n in set(zip(kinds, classes, arities, strict=True)):
        want = arity.get(kind)
        if not issubclass(attrs, ATTRS_OF[kind]) or (want is not None and n != want) or (
                kind is NodeKind.OP and n == 0):
            return None
    sinks = [i for i, k in enumerate(kinds) if k is NodeKind.SINK]
    if set(chain.from_iterable(sources)).union(sinks) != set(range(len(run))):
        return None  # a non-sink nobody consumes
    dequantizes = [i for i, k in enumerate(kinds) if k is NodeKind.DEQUANTIZE]
    return RunShape(classes, arities.count(0), _edges(sources, arities), _picker(dequantizes),
                    _picker([sources[i][0] for i in dequantizes]),
                    _picker([i for i, k in enumerate(kinds) if arities[i] and k not in _BULK]),
                    _picker(sinks))


def _edges(sources: list[list[int]], arities: tuple[int, ...]
           ) -> tuple[tuple[int, Picker, tuple[Picker, ...]], ...]:
    """For each arity of the run's nodes: the nodes of that arity, and the nodes their
    inputs are (places from ``sources``): one picker per input slot for arities 1 and 2
    (the many dequantizes and sinks), one of all their inputs in order for the rest."""
    out = []
    for n in sorted(set(arities) - {0}):
        fed = [i for i, a in enumerate(arities) if a == n]
        slots = [[sources[i][j] for i in fed] for j in range(n)] if n <= _PAIRED else \
            [[s for i in fed for s in sources[i]]]
        out.append((n, _picker(fed), tuple(map(_picker, slots))))
    return tuple(out)


_BULK = frozenset((NodeKind.DEQUANTIZE, NodeKind.OP, NodeKind.SINK))  # spec rules: in bulk / none
_PAIRED = 2  # arities up to this: one picker per input slot


def runs_of(nodes: Sequence[Node], lengths: Sequence[int]) -> Iterator[Sequence[Node]]:
    """``nodes`` cut into runs of ``lengths`` (their sum: ``len(nodes)``)."""
    ends = list(accumulate(lengths))
    return map(nodes.__getitem__, map(slice, chain((0,), ends), ends))


def runs_are_sound(nodes: Sequence[Node], lengths: Sequence[int], arity: dict[NodeKind, int],
                   node_problems: Callable[[Node], list[str]]
                   ) -> tuple[list[RunShape], list[Sequence[Node]]] | None:
    """Invariants 1-3 of the graph ``nodes`` (as :func:`verify_bulk.graph_is_sound`),
    proven run by run: the runs and their shapes, or ``None`` (not proven)."""
    if sum(lengths) != len(nodes):
        return None
    shapes: dict[tuple[NodeKind, ...], RunShape] = {}
    proven: list[RunShape] = []
    runs = list(runs_of(nodes, lengths))
    dequantizes: list[Node] = []
    checked: list[Node] = []
    sinks: list[Node] = []
    for run in runs:
        kinds = tuple(map(_KIND, run))
        shape = shapes.get(kinds)
        if shape is None or not _fits(run, shape):
            shape = shape_of(run, arity)
            if shape is None:
                return None
            shapes[kinds] = shape
        proven.append(shape)
        dequantized = shape.dequantizes(run)
        if len(dequantized) < _SHARED or not _alike(dequantized, shape.weights(run)):
            dequantizes += dequantized  # (judged in bulk, one by one)
        checked += shape.checked(run)
        sinks += shape.sinks(run)
    if not (specs_hold(dequantizes, checked, node_problems, sinks) and one_producer(sinks)):
        return None
    return proven, runs


_SHARED = 16  # dequantizes in a run from which their shared spec is looked for


def _alike(dequantized: tuple[Node, ...], inputs: Sequence[Node] | None = None) -> bool:
    """A stack's dequantizes share one spec, one attrs and one weight spec (equal ones, at
    least): the spec rule of one (shape kept, dtype the attrs') is the rule of all.
    ``inputs``: their first inputs (or nodes equal to them), when the caller has them."""
    count = len(dequantized)
    specs, attrs = list(map(_SPEC, dequantized)), list(map(_ATTRS, dequantized))
    weights = list(map(_SPEC, map(_FIRST, map(_INPUTS, dequantized)) if inputs is None
                       else inputs))
    spec, a, weight = specs[0], attrs[0], weights[0]
    return (specs.count(spec) == count and attrs.count(a) == count
            and weights.count(weight) == count and spec.shape == weight.shape
            and spec.dtype == a.dtype)


def _fits(run: Sequence[Node], shape: RunShape) -> bool:
    """``run`` (of ``shape``'s kinds) has its attrs types, arities and every input where
    the shape's proof put it (compared as objects: identity, else equality)."""
    every = list(map(_INPUTS, run))
    if tuple(map(type, map(_ATTRS, run))) != shape.classes or \
            every.count(()) != shape.unfed:  # (the reads: no inputs)
        return False
    for n, fed, slots in shape.edges:
        inputs = fed(every)
        if n <= _PAIRED:  # (each node's inputs, as a tuple, equal to the picked ones, zipped)
            if inputs != tuple(zip(*(pick(run) for pick in slots), strict=True)):
                return False
        elif set(map(len, inputs)) != {n} or tuple(chain.from_iterable(inputs)) != slots[0](run):
            return False  # (the others have none: as many as the shape's have none)
    return True


def release_by_runs(runs: list[Sequence[Node]], shapes: list[RunShape],
                    steps: Sequence["Step"], distinct: bool = False) -> bool:
    """Every node a step runs is, as the same object, a node of the run its first sink
    is in (so of the graph), and no two run nodes are equal: distinct hashes, or, in a
    graph of ``distinct`` nodes (no two equal), each step in a run of its own, running
    each of its nodes once."""
    home: dict[int, int] = {}
    for r, (run, shape) in enumerate(zip(runs, shapes, strict=True)):
        home.update(zip(map(id, shape.sinks(run)), repeat(r)))
    ran_all: list[list[Node]] = []
    homes: list[int] = []
    found: dict[tuple[int, int], Picker] = {}
    for step in steps:
        ran = list(chain.from_iterable(step.sources))
        for stage in step.materialize:
            ran.extend(chain.from_iterable(stage))
        ran.extend(step.sinks)
        r = home.get(id(step.sinks[0]), -1) if step.sinks else -1
        if r < 0:
            return False
        run, key = runs[r], (id(shapes[r]), len(ran))
        pick = found.get(key)
        if pick is None or not all(map(is_, ran, pick(run))):
            place = dict(zip(map(id, run), range(len(run)), strict=True))
            if not all(map(place.__contains__, map(id, ran))):
                return False
            places = [place[id(n)] for n in ran]
            if len(set(places)) != len(places):
                return False  # (a node run twice: equal hashes below too)
            pick = found[key] = _picker(places)
        ran_all.append(ran)
        homes.append(r)
    if distinct and len(set(homes)) == len(homes):
        return True  # (each step's nodes at places of its own, in a graph of distinct nodes)
    hashes = list(map(_HASH, chain.from_iterable(ran_all)))
    return len(set(hashes)) == len(hashes)
