"""``verify``: the invariants of a plan graph and of the steps lowered from it.

Run on what executes, before any byte is read (``torch.fx`` ``Graph.lint`` style: each
message names the node and the fix). Checks:

1. topological order: every input is a node of the graph listed before its consumer
   (so there is no cycle and nothing dangles);
2. each node kind has its arity and its attrs type; shapes and dtypes agree along every
   edge (a cast changes only the dtype, a sink takes its input's spec, a shard's output
   is its region, ...); each model tensor has at most one producer;
3. every intermediate has a consumer, and every node a step runs is released when that
   step is finalized (it belongs to exactly one step);
4. every destination is covered exactly once by the fragments written into it;
5. every read lies inside its entry's bytes, inside its file's data section;
6. the schedule submits every step once and finalizes it once, after submitting it: the
   finalize is where the step's intermediates are released (:func:`check_events`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from operator import attrgetter

from weightplan.errors import GraphError
from weightplan.planner.inputs.checkpoint import Checkpoint, TensorEntry
from weightplan.planner.tensors.verify.coverage import coverage_problem
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import Fragment, View
from weightplan.planner.tensors.ir.graph import PlanGraph
from weightplan.planner.tensors.ir.nodes import (
    ATTRS_OF, CastAttrs, DequantizeAttrs, Node, NodeKind, QuantizeAttrs, ShardAttrs, SinkAttrs,
)
from weightplan.planner.tensors.lower.placement import ReadTask, Step
from weightplan.planner.tensors.lower.quant_steps import quantize_fragments
from weightplan.planner.tensors.schedule.schedule import Event, EventKind
from weightplan.planner.tensors.verify.verify_bulk import (
    graph_is_sound, node_positions, release_is_sound,
)
from weightplan.planner.tensors.verify.verify_runs import release_by_runs, runs_are_sound
from weightplan.planner.tensors.verify.verify_stacks import stack_landed, unproven_reads

_FRAGMENT, _TARGET, _ZERO = attrgetter("fragment"), attrgetter("target"), 0
_LONG_RUNS = 8  # nodes per run from which runs are proven one by one (a few: the whole graph)
_ARITY = {NodeKind.READ: 0, NodeKind.CAST: 1, NodeKind.SINK: 1, NodeKind.SHARD: 1,
          NodeKind.QUANTIZE: 1, NodeKind.DEQUANTIZE: 2}


def verify(graph: PlanGraph, steps: Sequence[Step] = (), checkpoint: Checkpoint | None = None,
           runs: Sequence[int] | None = None) -> None:
    """Raise :class:`GraphError` listing every broken invariant (see the module docstring).
    ``runs``: where the graph's conversions meet (their node counts, in order), a hint
    that lets each conversion be proven on its own (:mod:`verify_runs`)."""
    problems = check(graph, steps, checkpoint, runs)
    if problems:
        raise GraphError(problems)


def check(graph: PlanGraph, steps: Sequence[Step] = (), checkpoint: Checkpoint | None = None,
          runs: Sequence[int] | None = None) -> list[str]:
    """Every broken invariant, as messages (empty: the plan is consistent)."""
    proof = None
    if runs is not None and len(graph.nodes) >= _LONG_RUNS * len(runs):
        proof = runs_are_sound(graph.nodes, runs, _ARITY, check_node)
    if proof is not None:  # not proven run by run: the whole-graph proof, then the exact pass
        shapes, cut = proof
        problems = [] if release_by_runs(cut, shapes, steps, graph.distinct) else \
            check_release(graph, steps)
    else:
        position = node_positions(graph.nodes)
        problems = check_graph(graph, position)
        if problems:  # the steps' checks assume a sound graph
            return problems
        problems += check_release(graph, steps, position)
    sections = _sections(checkpoint)
    for step in steps:  # (a step's runs proven in bulk first: verify_stacks)
        landed = stack_landed(step) if step.runs else None
        if landed is None or _coverage_problems(step, landed):
            problems += check_coverage(step)
        problems += _read_problems(unproven_reads(step, sections), sections)
    return problems


def check_graph(graph: PlanGraph, position: dict[int, int] | None = None) -> list[str]:
    """Invariants 1-3 of the graph alone (``position``: :func:`node_positions` of its
    nodes, when the caller has it). Proven in bulk first; the per-node pass below words
    each problem when the proof fails."""
    position = node_positions(graph.nodes) if position is None else position
    if graph_is_sound(graph.nodes, position, _ARITY, check_node):
        return []
    problems: list[str] = []
    seen: set[Node] = set()
    producers: dict[str, Node] = {}
    for node in graph.nodes:
        for source in node.inputs:
            if source not in seen:
                where = "later in the graph (a cycle, or out of order)" if source in graph \
                    else "not in the graph"
                problems.append(f"{node!r}: its input {source!r} is {where}; build nodes "
                                "after their inputs and add every input to the graph")
        seen.add(node)
        if node.inputs or not isinstance(node.attrs, ATTRS_OF[node.kind]) \
                or _ARITY.get(node.kind, 0) != 0 or node.kind is NodeKind.OP:
            problems += check_node(node)  # (a well-formed input-less node has nothing to check)
        if isinstance(node.attrs, SinkAttrs) and node.attrs.dest.written:
            for alias in node.attrs.dest.aliases:
                other = producers.setdefault(alias, node)
                if other is not node:
                    problems.append(f"{node!r}: model tensor {alias} also comes from {other!r}; "
                                    "keep one producer (tied names load once)")
    problems += _unconsumed(graph)
    return problems


def check_node(node: Node) -> list[str]:
    """Arity, attrs type and the spec rules of one node's kind."""
    if not isinstance(node.attrs, ATTRS_OF[node.kind]):
        return [f"{node!r}: a {node.kind.value} node needs {ATTRS_OF[node.kind].__name__}, has "
                f"{type(node.attrs).__name__}; build it with its kind's attrs"]
    arity = _ARITY.get(node.kind)
    if arity is not None and len(node.inputs) != arity:
        return [f"{node!r}: a {node.kind.value} node takes {arity} input(s), has "
                f"{len(node.inputs)}; rewire it"]
    if node.kind is NodeKind.OP and not node.inputs:
        return [f"{node!r}: an op output with no inputs; wire it to the values it is made of"]
    return _spec_problems(node)


def _spec_problems(node: Node) -> list[str]:
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
        inside = all(0 <= s and e <= n for p in a.pieces
                     for s, e, n in zip(p.starts, p.stops, first.shape, strict=True))
        if a.local_shape != spec.shape or first.dtype != spec.dtype or not inside:
            wrong = (f"a shard yields its pieces {list(a.local_shape)} (inside the input "
                     f"{list(first.shape)}) in {first.dtype}")
    elif isinstance(a, (DequantizeAttrs, QuantizeAttrs)) and first is not None:
        scale = isinstance(a, QuantizeAttrs) and a.scale
        if not scale and (first.shape != spec.shape or spec.dtype != a.dtype):
            wrong = f"a {node.kind.value} keeps the shape {list(first.shape)} and yields {a.dtype}"
    return [] if wrong is None else [f"{node!r}: {wrong}, has {spec}"]


def _unconsumed(graph: PlanGraph) -> list[str]:
    consumed = {source for node in graph.nodes for source in node.inputs}
    return [f"{node!r} has no consumer and would never be released; feed it to a sink "
            "(a DISCARD sink drops it) or leave it out of the graph"
            for node in graph.nodes if node.kind is not NodeKind.SINK and node not in consumed]


def check_release(graph: PlanGraph, steps: Iterable[Step],
                  position: dict[int, int] | None = None) -> list[str]:
    """Every node a step runs is in the graph and is released by exactly one step."""
    steps = tuple(steps)
    if release_is_sound(node_positions(graph.nodes) if position is None else position, steps):
        return []
    owner: dict[Node, int] = {}
    problems = []
    for s, step in enumerate(steps):
        ran = [n for stream in step.sources for n in stream]
        ran += [n for stage in step.materialize for stream in stage for n in stream]
        ran += list(step.sinks)
        for node in ran:
            if node not in graph:
                problems.append(f"step {s + 1} ({step.label}) runs {node!r}, which is not in "
                                "the graph; lower steps from the verified graph only")
            elif owner.setdefault(node, s) != s:
                problems.append(f"{node!r} is run by steps {owner[node] + 1} and {s + 1}; it "
                                "would be released twice: give each conversion its own nodes")
    return problems


def check_coverage(step: Step) -> list[str]:
    """Each destination is covered exactly once by the fragments written into it."""
    return _coverage_problems(step, list(filter(None, map(_FRAGMENT, step.reads))))


def _coverage_problems(step: Step, landed: list[Fragment]) -> list[str]:
    """:func:`check_coverage`, the reads landing in ``landed``."""
    if len(landed) == 1 and len(step.destinations) == 1 and not step.outputs \
            and not step.quantized and _fills(landed[0], step.destinations[0]):
        return []  # (the usual step: one read fills its tensor, as coverage_problem finds)
    frags: list[list[Fragment]] = [[] for _ in step.destinations]
    if len(frags) == 1 and all(map(_ZERO.__eq__, map(_TARGET, landed))):
        frags[0] += landed  # (one destination: a stack's reads all land in it)
    else:
        for fragment in landed:
            frags[fragment.target].append(fragment)
    for stream in step.outputs:
        for placed in stream:
            for f in placed:
                frags[f.target].append(f)
    for quantized in step.quantized:
        for f in quantize_fragments(quantized, step.destinations):
            frags[f.target].append(f)
    problems = []
    for dest, fs in zip(step.destinations, frags, strict=True):
        problem = coverage_problem(dest_view(dest), fs)
        if problem is not None:
            problems.append(f"destination {dest.key} of step {step.label}: {problem}; the "
                            "op's place() must map each output element to exactly one input")
    return problems


def _fills(fragment: Fragment, dest: Destination) -> bool:
    """The fragment lands in all of ``dest`` (the one view of it) from a region of its
    size: what :func:`coverage_problem` accepts first, without making the view."""
    view = fragment.view
    return (fragment.target == 0 and type(view) is View and view.offset == 0
            and view.shape == dest.spec.shape and view.stride == dest.stride
            and fragment.region.numel == math.prod(view.shape))


def dest_view(dest: Destination) -> View:
    return View(dest.spec.shape, dest.stride)


def check_events(steps: int, events: Sequence[Event]) -> list[str]:
    """Each of ``steps`` steps is submitted once, then finalized once (its release point)."""
    submitted: set[int] = set()
    finalized: set[int] = set()
    problems = []
    for n, event in enumerate(events):
        s = event.step
        if event.kind is EventKind.SUBMIT and s in submitted:
            problems.append(f"event {n}: step {s + 1} is submitted twice; submit each step once")
        if event.kind is EventKind.FINALIZE and (s not in submitted or s in finalized):
            problems.append(f"event {n}: step {s + 1} is finalized before it is submitted or "
                            "twice; finalize each submitted step once")
        (submitted if event.kind is EventKind.SUBMIT else finalized).add(s)
    never = sorted(set(range(steps)) - finalized)
    if never:
        problems.append(f"steps {[s + 1 for s in never][:5]} are never finalized, so their "
                        "intermediates are never released; finalize every step")
    return problems


def check_reads(reads: Iterable[ReadTask], checkpoint: Checkpoint | None) -> list[str]:
    """Every read stays inside its entry's bytes and its file's data section."""
    return _read_problems(reads, _sections(checkpoint))


def _sections(checkpoint: Checkpoint | None) -> dict[str, tuple[int, int]]:
    return {f.path: (f.data_start, f.size) for f in (checkpoint.files if checkpoint else ())}


def _read_problems(reads: Iterable[ReadTask], sections: dict[str, tuple[int, int]]
                   ) -> list[str]:
    problems: list[str] = []
    dequantize = NodeKind.DEQUANTIZE
    layout = spec = file = section = None
    inside = True
    for task in reads:
        node = task.node
        entry: TensorEntry = (node.inputs[0] if node.kind is dequantize  # task.entry, inline
                              else node).attrs.entry  # type: ignore[union-attr]
        if task.layout is not layout or entry.spec is not spec:  # (the experts share both)
            layout, spec = task.layout, entry.spec
            pieces, first, length = layout.pieces, layout.first, layout.length
            inside = (first >= 0 and first + length <= entry.nbytes and length == (
                pieces[0][1] if len(pieces) == 1 else sum(n for _, n in pieces)))
        if entry.file is not file:
            file = entry.file
            section = sections.get(file) if file is not None else None
        start = entry.offset + first  # task.byte_range[0]
        if not inside or (section is not None and not section[0] <= start <= section[1] - length):
            problems += _read_problem(task, entry, section)
    return problems


def _read_problem(task: ReadTask, entry: TensorEntry, section: tuple[int, int] | None
                  ) -> list[str]:
    problems = []
    start, length = task.byte_range
    if start < entry.offset or start + length > entry.offset + entry.nbytes:
        problems.append(f"read of {entry.key} [{start}, {start + length}) leaves the "
                        f"tensor's bytes [{entry.offset}, {entry.offset + entry.nbytes}); "
                        "the fragment's region must lie inside the tensor")
    if section is not None and not (section[0] <= start and start + length <= section[1]):
        problems.append(f"read of {entry.key} [{start}, {start + length}) leaves the data "
                        f"section [{section[0]}, {section[1]}) of {entry.file}; the "
                        "header's offsets are wrong: re-open the checkpoint")
    if sum(n for _, n in task.pieces) != length:
        problems.append(f"read of {entry.key}: its pieces cover {sum(n for _, n in task.pieces)}"
                        f" of {length} bytes; split the range without gaps")
    return problems
