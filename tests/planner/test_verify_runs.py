"""A run of back-to-back segments of one length that follow one proof (a header of plain
keys: read → sink, thousands of times) is proven in columns (``graph_checks._run_holds``):
it gives the segments one by one gives, and vouches for no node list the per-node pass
finds broken (a property test over mutated lists)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from weightplan.ops import MergeModulelist
from weightplan.planner.pipelines.lower import plan_graph
from weightplan.planner.tensors.ir.graph import PlanGraph
from weightplan.planner.tensors.lower.placement import plan_step
from weightplan.planner.tensors.verify import graph_checks
from weightplan.planner.tensors.verify.graph_checks import graph_holds, graph_problems
from weightplan.planner.tensors.verify.verify import check, release_holds

from tests.planner.core import checkpoint, conversion, entry
from tests.planner.graph_mutations import mutated


def plains(count: int = 12, stacked_at: tuple[int, ...] = (5,)):
    """``count`` plain keys (one read, one sink each), with a three-expert stack in the
    run after each of ``stacked_at`` (a segment of another length)."""
    convs, entries = [], []
    for k in range(count):
        e = entry(f"k{k}.w", (2, 3), 24 * len(entries))
        entries.append(e)
        convs.append(conversion([[e]], [f"k{k}.w"]))
        if k in stacked_at:
            experts = [entry(f"s{k}.e.{i}.w", (2, 3), 24 * (len(entries) + i)) for i in range(3)]
            entries += experts
            convs.append(conversion([experts], [f"s{k}"], [MergeModulelist(0)]))
    return convs, [plan_step(c) for c in convs], checkpoint(*entries)


def one_by_one(nodes, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(graph_checks, "_RUN", 1 << 40)
        return graph_holds(nodes)


def test_a_run_of_plain_segments_is_proven_as_one_by_one(monkeypatch):
    convs, steps, ckpt = plains(count=20, stacked_at=(3, 11))
    graph = plan_graph(convs)
    together, alone = graph_holds(graph.nodes), one_by_one(graph.nodes, monkeypatch)
    assert together is not None and alone is not None
    assert (together.ends, together.proofs, together.home) == (alone.ends, alone.proofs,
                                                              alone.home)
    assert release_holds(together, steps, graph.distinct)
    assert check(graph, steps, ckpt) == []


def test_a_sink_fed_by_another_keys_read_in_a_run_is_refused():
    convs, _, _ = plains(count=12, stacked_at=())
    nodes = plan_graph(convs).nodes
    broken = mutated(nodes, 2 * 8 + 1, 2 * 7, "rewire")  # (key 8's sink fed key 7's read)
    assert graph_holds(broken) is None
    assert graph_problems(PlanGraph(broken))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_runs_and_the_per_node_pass_agree(data):
    """Whatever is done to a node list of runs (a node dropped, moved, repeated, or an
    input swapped), the proof vouches only for lists the per-node pass finds sound, and
    refuses every list it finds broken."""
    nodes = plan_graph(plains(count=14, stacked_at=(6,))[0]).nodes
    i = data.draw(st.integers(0, len(nodes) - 1))
    j = data.draw(st.integers(0, len(nodes) - 1))
    how = data.draw(st.sampled_from(["drop", "move", "repeat", "rewire", "none"]))
    nodes = mutated(nodes, i, j, how)
    problems = graph_problems(PlanGraph(nodes))
    segments = graph_holds(nodes)
    if segments is not None:
        assert problems == []
    if problems:
        assert segments is None
    if how == "none":
        assert segments is not None
