"""``verify``'s invariants of the graph alone, over every node and every edge.

1. topological order: every input is a node of the graph (or equal to one) listed
   before its consumer, so there is no cycle and nothing dangles;
2. each node kind has its arity and its attrs type; shapes and dtypes agree along every
   edge (a cast changes only the dtype, a sink takes its input's spec, a shard's output
   is its region, ...);
3. every intermediate has a consumer, and each model tensor has at most one producer.

:func:`graph_holds` decides them for the whole graph in C-level passes over columns of
nodes (kinds, attrs types, inputs, specs), a *segment* at a time. The nodes are cut into
segments where a sink is followed by a read (where one conversion ends and the next
begins); each input must be a node of its own segment, listed before its consumer. The
first segment of each sequence of kinds is checked with a map of its nodes' places, which
gives each input's place in it; every later segment of those kinds is checked by
comparing each of its inputs with its own node at that place (identity, or equality);
the back-to-back segments of one length after it (a header of plain keys: thousands of
read → sink), in columns, every ``length``-th node at once (:func:`_run_holds`).
When anything is not shown so (an input in another segment included),
:func:`graph_problems` walks the nodes one by one and words each problem.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain, compress, groupby, repeat
from operator import and_, attrgetter, eq, is_, is_not, itemgetter, lt, not_, sub

from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.tensors.ir.destination import DestKind, Destination
from weightplan.planner.tensors.ir.graph import PlanGraph
from weightplan.planner.tensors.ir.nodes import (
    ATTRS_OF, CastAttrs, DequantizeAttrs, Node, NodeKind, QuantizeAttrs, ShardAttrs, SinkAttrs,
)

ARITY = {NodeKind.READ: 0, NodeKind.CAST: 1, NodeKind.SINK: 1, NodeKind.SHARD: 1,
         NodeKind.QUANTIZE: 1, NodeKind.DEQUANTIZE: 2}  # (an op's: any, but not none)
SPEC_RULED = frozenset((NodeKind.CAST, NodeKind.SINK, NodeKind.SHARD, NodeKind.QUANTIZE))
_INPUTS, _KIND, _ATTRS_TYPE = attrgetter("inputs"), attrgetter("kind"), attrgetter("attrs.__class__")
_FIRST, _SECOND, _ATTRS = itemgetter(0), itemgetter(1), attrgetter("attrs")
_SPEC, _DEST, _ALIASES = attrgetter("spec"), attrgetter("attrs.dest"), attrgetter("aliases")
Picker = Callable[[Sequence[Node]], tuple[Node, ...]]  # a segment → its nodes at some places


def picker(places: Sequence[int]) -> Picker:
    """``segment`` → the tuple of its nodes at ``places`` (one C call: for one place or
    none, the slice of the segment that holds them)."""
    if len(places) > 1:
        return itemgetter(*places)
    if places:
        return itemgetter(slice(places[0], places[0] + 1))
    return _NONE


_NONE: Picker = itemgetter(slice(0, 0))


@dataclass(frozen=True, slots=True)
class Segments:
    """The graph's nodes cut into segments, as :func:`graph_holds` proved them (where a
    sink is followed by a read) or :func:`~weightplan.planner.tensors.verify.derived.
    derived` did (one per conversion)."""

    nodes: Sequence[Node]
    ends: list[int]  # segment k is nodes[ends[k - 1]:ends[k]] (from 0)
    proofs: list[int]  # per segment: which proof it shares (segments of one kind sequence)
    home: dict[int, int]  # id(sink) → its segment

    def segment(self, k: int) -> Sequence[Node]:
        return self.nodes[self.ends[k - 1] if k else 0:self.ends[k]]


@dataclass(frozen=True, slots=True)
class _Proof:
    """What the first segment of a kind sequence showed, for every segment of it."""

    index: int
    arities: list[int]
    classes: tuple[type, ...]  # the nodes' attrs types
    sources: Picker  # each node's inputs, in order: the nodes at these places
    dequantizes: Picker  # (their spec rule is judged for all of them at once)
    weights: Picker  # the dequantizes' first inputs
    ruled: Picker  # the casts, shards and quantizes (spec rules judged one by one)
    sinks: Picker  # (their spec rule and one producer per model tensor judged in columns)
    # the places the pickers pick (a run of segments of this kind sequence: in columns)
    places: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...],
                  tuple[int, ...]] = ((), (), (), (), ())


def check_graph(graph: PlanGraph) -> tuple[list[str], Segments | None]:
    """Invariants 1-3, each broken one as a message in node order (empty: none), and the
    segments the graph was proven in (``None``: not proven so)."""
    segments = graph_holds(graph.nodes)
    return ([], segments) if segments is not None else (graph_problems(graph), None)


def graph_holds(nodes: Sequence[Node]) -> Segments | None:
    """The segments of ``nodes`` when invariants 1-3 hold (see the module docstring);
    ``None`` when that isn't shown."""
    kinds = tuple(map(_KIND, nodes))
    inputs = tuple(map(_INPUTS, nodes))
    count = len(nodes)
    # a segment ends where a sink is followed by a read (where one conversion ends), and at
    # the end of the nodes
    ends = [i + 1 for i in compress(range(count), map(is_, kinds, repeat(NodeKind.SINK)))
            if i + 1 < count and kinds[i + 1] is NodeKind.READ]
    ends.append(count)
    proofs: dict[tuple[NodeKind, ...], _Proof] = {}
    found = _Found([], {}, [], [], [], [])
    run_ends = _run_ends(ends)  # (per segment: where its run of one length ends)
    start, k, total, alone = 0, 0, len(ends), 0
    while k < total:
        end = ends[k]
        segment, key, fed = nodes[start:end], kinds[start:end], inputs[start:end]
        arities = list(map(len, fed))
        flat = tuple(chain.from_iterable(fed))
        classes = tuple(map(_ATTRS_TYPE, segment))
        proof = proofs.get(key)
        if proof is None or proof.arities != arities or proof.classes != classes or \
                proof.sources(segment) != flat:
            proof = _proven(segment, key, classes, flat, arities, len(proofs))
            if proof is None:
                return None
            proofs[key] = proof
        found.add(segment, proof)
        length, start, k = end - start, end, k + 1
        # the segments of its length after it: when they all follow its proof, at once
        after = run_ends[k - 1] - k
        if after < _RUN or k < alone:
            continue
        if not _run_holds(nodes, kinds, inputs, start, length, after, key, proof):
            alone = run_ends[k - 1]  # (the rest of the run: segment by segment)
            continue
        found.add_run(nodes, start, length, after, proof)
        start, k = start + length * after, k + after
    if not _specs_hold(found.dequantizes, found.weights, found.ruled) or \
            not _sinks_hold(found.sinks):
        return None
    return Segments(nodes, ends, found.shared, found.home)


@dataclass(slots=True)
class _Found:
    """What :func:`graph_holds` gathers of the segments proven so far: each one's proof,
    where each sink is, and the nodes whose spec rules are judged at the end."""

    shared: list[int]  # per segment: its proof
    home: dict[int, int]  # id(sink) → its segment
    dequantizes: list[Node]
    weights: list[Node]  # (each dequantize's weight)
    ruled: list[Node]
    sinks: list[Node]

    def add(self, segment: Sequence[Node], proof: _Proof) -> None:
        picked = proof.sinks(segment)
        self.home.update(zip(map(id, picked), repeat(len(self.shared))))
        self.sinks += picked
        self.shared.append(proof.index)
        self.dequantizes += proof.dequantizes(segment)
        self.weights += proof.weights(segment)
        self.ruled += proof.ruled(segment)

    def add_run(self, nodes: Sequence[Node], start: int, length: int, count: int,
                proof: _Proof) -> None:
        """``count`` segments of ``length`` from ``start`` on, all following ``proof``
        (:func:`_run_holds`): each place of theirs taken as a column."""
        stop, first = start + length * count, len(self.shared)
        _, at_dequantizes, at_weights, at_ruled, at_sinks = proof.places
        for p in at_sinks:
            column = nodes[start + p:stop:length]
            self.home.update(zip(map(id, column), range(first, first + count), strict=True))
            self.sinks += column
        self.shared += [proof.index] * count
        for p, w in zip(at_dequantizes, at_weights, strict=True):
            self.dequantizes += nodes[start + p:stop:length]
            self.weights += nodes[start + w:stop:length]
        for p in at_ruled:
            self.ruled += nodes[start + p:stop:length]


_RUN = 4  # (fewer segments of one length after one: taken one by one)


def _run_ends(ends: list[int]) -> list[int]:
    """For each segment, the index after the last segment of the run of back-to-back
    segments of its length it is in."""
    lengths = list(map(sub, ends, [0, *ends[:-1]]))
    out: list[int] = []
    for _, run in groupby(lengths):
        count = sum(1 for _ in run)
        out += [len(out) + count] * count
    return out


def _proven(segment: Sequence[Node], kinds: tuple[NodeKind, ...], classes: tuple[type, ...],
            flat: tuple[Node, ...], arities: list[int], index: int) -> _Proof | None:
    """The proof of one segment: every (kind, attrs type, arity) well formed, every input
    a node of the segment (as an object) listed before its consumer, every node but the
    sinks an input; ``None``: not so."""
    if not all(well_formed(*row) for row in set(zip(kinds, classes, arities, strict=True))):
        return None
    count = len(segment)
    place = dict(zip(map(id, segment), range(count), strict=True))
    at = list(map(place.get, map(id, flat), repeat(count)))
    consumers = list(chain.from_iterable(map(repeat, range(count), arities)))
    if not all(map(lt, at, consumers)):
        return None
    sinks = [i for i, k in enumerate(kinds) if k is NodeKind.SINK]
    if len(set(at).union(sinks)) != count:
        return None  # (a node that is neither consumed nor a sink)
    dequantizes = [i for i, k in enumerate(kinds) if k is NodeKind.DEQUANTIZE]
    first = dict(zip(reversed(consumers), reversed(at), strict=True))  # (each one's first)
    weights = [first[i] for i in dequantizes]
    ruled = [i for i, k in enumerate(kinds) if k in SPEC_RULED and k is not NodeKind.SINK]
    return _Proof(index, arities, classes, picker(at), picker(dequantizes), picker(weights),
                  picker(ruled), picker(sinks),
                  (tuple(at), tuple(dequantizes), tuple(weights), tuple(ruled), tuple(sinks)))


def _run_holds(nodes: Sequence[Node], kinds: tuple[NodeKind, ...],
               inputs: tuple[tuple[Node, ...], ...], start: int, length: int, count: int,
               key: tuple[NodeKind, ...], proof: _Proof) -> bool:
    """Whether the ``count`` segments of ``length`` nodes from ``start`` on all follow
    ``proof`` (of kinds ``key``), shown in columns: node ``p`` of each segment (every
    ``length``-th node) has kind ``key[p]``, the proof's attrs type and arity, and its
    inputs are, as objects, the nodes of its own segment at the proven places (what the
    segment-by-segment pass shows of each, by equality)."""
    stop = start + length * count
    flat = 0
    for p in range(length):
        column = slice(start + p, stop, length)
        fed = inputs[column]
        arity = proof.arities[p]
        if kinds[column].count(key[p]) != count or \
                not all(map(is_, map(_ATTRS_TYPE, nodes[column]), repeat(proof.classes[p]))) or \
                not all(map(eq, map(len, fed), repeat(arity))):
            return False
        for q in range(arity):
            place = proof.places[0][flat + q]
            if not all(map(is_, map(itemgetter(q), fed), nodes[start + place:stop:length])):
                return False
        flat += arity
    return True


def _specs_hold(dequantizes: list[Node], weights: list[Node], ruled: list[Node]) -> bool:
    """Every node's spec rule: the many dequantizes' judged once per distinct row of the
    objects the rule reads (their spec, attrs and weight's spec, and their arity: a
    stack's dequantizes share them, Kimi-K2's 69k are a few rows), found in C-level
    passes; casts, sinks, shards and quantizes one by one (ops and reads have none)."""
    specs, attrs = list(map(_SPEC, dequantizes)), list(map(_ATTRS, dequantizes))
    fed = list(map(_SPEC, weights))
    rows = dict(zip(zip(map(id, specs), map(id, attrs), map(id, fed),
                        map(len, map(_INPUTS, dequantizes)), strict=True),
                    range(len(specs)), strict=True))
    judged = [_dequantize_rule(specs[i], attrs[i], fed[i], row[3]) for row, i in rows.items()]
    # each keeps its weight's shape; or a packed one takes as many inputs as its scheme
    # has parts and any other keeps its weight's shape (:func:`spec_problems`)
    if not all(map(_FIRST, judged)) and not all(map(_SECOND, judged)):
        return False
    return not any(map(spec_problems, ruled))


def _dequantize_rule(spec: TensorSpec, attrs: object, weight: TensorSpec, arity: int
                     ) -> tuple[bool, bool]:
    """Whether a dequantize with these objects yields its attrs' dtype keeping its
    weight's shape, and whether it keeps :func:`spec_problems`' rule (a packed format's
    logical shape: as many inputs as its scheme has parts)."""
    if not isinstance(attrs, DequantizeAttrs):  # (proven well formed before: not met)
        return False, False
    typed = spec.dtype == attrs.dtype
    kept = typed and spec.shape == weight.shape
    if attrs.scheme is None:
        return kept, kept
    return kept, typed and arity == len(attrs.scheme.roles)  # type: ignore[attr-defined]


def _sinks_hold(sinks: list[Node]) -> bool:
    """Every sink's spec rule (:func:`spec_problems`) and one producer per model tensor,
    in columns: a sink whose input's spec and destination's spec are its own (the same
    objects, as the builder makes them) keeps the rule; the others are judged one by
    one. No alias of a written destination is written twice."""
    specs = list(map(_SPEC, sinks))
    fed = map(is_, specs, map(_SPEC, map(_FIRST, map(_INPUTS, sinks))))
    dests = list(map(_DEST, sinks))
    same = map(and_, fed, map(is_, specs, map(_SPEC, dests)))
    if any(map(spec_problems, compress(sinks, map(not_, same)))):
        return False
    aliases = written_aliases(sinks, dests)
    return len(set(aliases)) == len(aliases)


def written_aliases(sinks: Sequence[Node], dests: Sequence[Destination] | None = None
                    ) -> list[str]:
    """The model tensors ``sinks`` write: each alias of each written destination (``dests``:
    the sinks' destinations, when the caller has them)."""
    dests = list(map(_DEST, sinks)) if dests is None else dests
    written = compress(dests, map(is_not, map(_KIND, dests), repeat(DestKind.DISCARD)))
    return list(chain.from_iterable(map(_ALIASES, written)))


def well_formed(kind: NodeKind, attrs: type, arity: int) -> bool:
    """A node of ``kind`` may have attrs of type ``attrs`` and ``arity`` inputs."""
    want = ARITY.get(kind)
    if kind is NodeKind.DEQUANTIZE and arity != want:  # a packed format: its parts
        return issubclass(attrs, ATTRS_OF[kind]) and 2 <= arity <= 4
    return issubclass(attrs, ATTRS_OF[kind]) and (arity == want if want is not None
                                                  else arity > 0)


def graph_problems(graph: PlanGraph) -> list[str]:
    """Invariants 1-3 node by node: each node's problems in order, then the unconsumed."""
    problems: list[str] = []
    seen: set[Node] = set()
    twice = _second_producers(graph.nodes)
    for node, again in zip(graph.nodes, twice, strict=True):
        for source in node.inputs:
            if source not in seen:
                where = "later in the graph (a cycle, or out of order)" if source in graph \
                    else "not in the graph"
                problems.append(f"{node!r}: its input {source!r} is {where}; build nodes "
                                "after their inputs and add every input to the graph")
        seen.add(node)
        problems += check_node(node) + again
    consumed = {source for node in graph.nodes for source in node.inputs}
    return problems + [f"{node!r} has no consumer and would never be released; feed it to a "
                       "sink (a DISCARD sink drops it) or leave it out of the graph"
                       for node in graph.nodes
                       if node.kind is not NodeKind.SINK and node not in consumed]


def _second_producers(nodes: Sequence[Node]) -> list[list[str]]:
    """For each node, the model tensors it writes that a node before it writes too."""
    producers: dict[str, Node] = {}
    twice: list[list[str]] = []
    for node in nodes:
        found: list[str] = []
        dest = node.attrs.dest if isinstance(node.attrs, SinkAttrs) else None
        if dest is not None and dest.written:
            for alias in dest.aliases:
                other = producers.setdefault(alias, node)
                if other is not node:
                    found.append(f"{node!r}: model tensor {alias} also comes from {other!r}; "
                                 "keep one producer (tied names load once)")
        twice.append(found)
    return twice


def check_node(node: Node) -> list[str]:
    """Arity, attrs type and the spec rules of one node's kind."""
    if not isinstance(node.attrs, ATTRS_OF[node.kind]):
        return [f"{node!r}: a {node.kind.value} node needs {ATTRS_OF[node.kind].__name__}, has "
                f"{type(node.attrs).__name__}; build it with its kind's attrs"]
    arity = ARITY.get(node.kind)
    if isinstance(node.attrs, DequantizeAttrs) and node.attrs.scheme is not None:
        arity = len(node.attrs.scheme.roles)  # type: ignore[attr-defined]  # a packed format's parts
    if arity is not None and len(node.inputs) != arity:
        return [f"{node!r}: a {node.kind.value} node takes {arity} input(s), has "
                f"{len(node.inputs)}; rewire it"]
    if node.kind is NodeKind.OP and not node.inputs:
        return [f"{node!r}: an op output with no inputs; wire it to the values it is made of"]
    return spec_problems(node)


def spec_problems(node: Node) -> list[str]:
    a, spec = node.attrs, node.spec
    first = node.inputs[0].spec if node.inputs else None
    wrong: str | None = None
    if isinstance(a, CastAttrs) and first is not None:
        if first.shape != spec.shape or spec.dtype != a.dtype:
            wrong = f"a cast keeps the shape {list(first.shape)} and yields {a.dtype}"
    elif isinstance(a, SinkAttrs) and first is not None:
        if first != spec or (a.dest.written and a.dest.spec != spec):
            wrong = (f"a sink takes its input's spec {first} and its destination's "
                     f"{a.dest.spec}; insert a cast node or fix the destination")
    elif isinstance(a, ShardAttrs) and first is not None:
        inside = all(len(p.starts) == len(first.shape) and all(
            0 <= s and e <= n for s, e, n in zip(p.starts, p.stops, first.shape, strict=True))
            for p in a.pieces)  # (a piece of another number of dims: not inside)
        if a.local_shape != spec.shape or first.dtype != spec.dtype or not inside:
            wrong = (f"a shard yields its pieces {list(a.local_shape)} (inside the input "
                     f"{list(first.shape)}) in {first.dtype}")
    elif isinstance(a, (DequantizeAttrs, QuantizeAttrs)) and first is not None:
        scale = isinstance(a, QuantizeAttrs) and a.scale
        packed = isinstance(a, DequantizeAttrs) and a.scheme is not None  # logical shape
        if packed and len(node.inputs) != len(a.scheme.roles):  # type: ignore[union-attr]
            wrong = f"a packed dequantize takes its parts {a.scheme.roles}"  # type: ignore[union-attr]
        elif not scale and ((first.shape != spec.shape and not packed) or spec.dtype != a.dtype):
            wrong = f"a {node.kind.value} keeps the shape {list(first.shape)} and yields {a.dtype}"
    return [] if wrong is None else [f"{node!r}: {wrong}, has {spec}"]
