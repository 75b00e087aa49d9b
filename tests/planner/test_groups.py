"""Groups made from runs of keys routed together equal the ones made from keys routed one
by one (in checkpoint order, where runs interleave), and fail the same way."""

import pytest
import torch

from weightplan import WeightConverter, WeightRenaming
from weightplan.errors import ConflictingTransformError, IndexGapError
from weightplan.ops import Concatenate, MergeModulelist
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.inputs.model_info import inspect_model
from weightplan.planner.keys import groups, route, router

from tests.conftest import module_with

_MERGE = WeightConverter(["experts.*.gate", "experts.*.up"], "experts.gate_up",
                         operations=[MergeModulelist(0), Concatenate(1)])
_STACK = WeightConverter("experts.*.down", "experts.down", operations=[MergeModulelist(0)])


def _keys(*names):
    return open_checkpoint({k: torch.zeros(1) for k in names})


def _experts(layers=(0, 1, 12), experts=12, parts=("gate", "down", "up")):
    return [f"layers.{i}.experts.{e}.{w}" for i in layers for e in range(experts) for w in parts]


def _exact(checkpoint, transforms, model, monkeypatch):
    """Routing with every key routed by itself (no template), in checkpoint order."""
    with monkeypatch.context() as m:
        m.setattr(router, "templates_of", lambda keys: [None] * len(keys))
        return route.route_checkpoint(checkpoint, transforms, model)


def _one_by_one(monkeypatch):
    """Counts the streams ordered run by run and one by one (:func:`groups._ordered`)."""
    said = {"runs": 0, "one by one": 0}
    real = groups._ordered

    def spy(converter, pattern, has_index, runs, *rest):
        joined = [i for run in sorted(runs, key=groups._first_index) for i in run.indices]
        if has_index:
            said["runs" if joined == list(range(len(joined))) else "one by one"] += 1
        return real(converter, pattern, has_index, runs, *rest)
    monkeypatch.setattr(groups, "_ordered", spy)
    return said


def _same(names, transforms, monkeypatch, model=None):
    bulk = route.route_checkpoint(_keys(*names), transforms, model)
    exact = _exact(_keys(*names), transforms, model, monkeypatch)
    assert bulk == exact
    return bulk


def test_groups_from_runs_equal_the_exact_ones(monkeypatch):
    names = _experts() + ["layers.0.norm", "embed", "layers.12.norm"]
    said = _one_by_one(monkeypatch)
    bulk = _same(names, [_MERGE, _STACK], monkeypatch)
    assert said["runs"] > 0
    sizes = [tuple(len(s) for s in g.sources) for g in bulk.groups]
    assert sizes.count((12, 12)) == 3 and sizes.count((12,)) == 3


def test_groups_with_keys_routed_one_by_one_equal_the_exact_ones(monkeypatch):
    # a renaming fires for layer 1's "up" keys only: they reach their group the slow way
    rename = WeightRenaming(r"\.upper$", ".up")
    names = [n.replace(".up", ".upper") if n.startswith("layers.1.") else n
             for n in _experts()]
    bulk = _same(names, [rename, _MERGE, _STACK], monkeypatch)
    assert len(bulk.groups) == 6


@pytest.mark.parametrize("drop, error", [
    ("layers.1.experts.5.down", IndexGapError),  # a gap in one stream
    ("layers.1.experts.11.gate", IndexGapError),  # one stream shorter than the other
])
def test_broken_groups_fail_the_same_way(drop, error, monkeypatch):
    names = [n for n in _experts() if n != drop]
    with pytest.raises(error) as bulk:
        route.route_checkpoint(_keys(*names), [_MERGE, _STACK], None)
    with pytest.raises(error) as exact:
        _exact(_keys(*names), [_MERGE, _STACK], None, monkeypatch)
    assert str(bulk.value) == str(exact.value)


def test_repeated_index_and_index_less_sources_fail_the_same_way(monkeypatch):
    loose = WeightConverter(r"experts\.\d+\.down", "experts.down",
                            operations=[MergeModulelist(0)])
    names = _experts(layers=(0,), experts=3, parts=("down",))
    with pytest.raises(ConflictingTransformError) as bulk:
        route.route_checkpoint(_keys(*names), [loose], None)
    with pytest.raises(ConflictingTransformError) as exact:
        _exact(_keys(*names), [loose], None, monkeypatch)
    assert str(bulk.value) == str(exact.value)
    stacked = WeightConverter(r"e\.*\.x\.\d", "e.x", operations=[MergeModulelist(0)])
    names = [f"e.{i}.x.{j}" for i in range(3) for j in range(2)]
    with pytest.raises(IndexGapError) as bulk:
        route.route_checkpoint(_keys(*names), [stacked], None)
    with pytest.raises(IndexGapError) as exact:
        _exact(_keys(*names), [stacked], None, monkeypatch)
    assert str(bulk.value) == str(exact.value)


def test_incomplete_groups_equal_the_exact_ones(monkeypatch):
    names = [n for n in _experts() if not (n.startswith("layers.12.") and n.endswith("up"))]
    bulk = _same(names, [_MERGE, _STACK], monkeypatch)
    assert [i.targets for i in bulk.incomplete] == [("layers.12.experts.gate_up",)]
    assert bulk.incomplete[0].present == tuple(
        f"layers.12.experts.{e}.gate" for e in range(12))  # in natural order


def test_groups_that_do_not_land_equal_the_exact_ones(monkeypatch):
    # layer 12 is not in the model (an extra layer)
    specs = {f"layers.{i}.experts.{w}": ((12, 1, 1), torch.float32)
             for i in (0, 1) for w in ("gate_up", "down")}
    bulk = _same(_experts(), [_MERGE, _STACK], monkeypatch, inspect_model(module_with(specs)))
    assert not any(r.note for r in bulk.routes)
    # ... and one of its keys is a model key: it keeps its name, leaving a gap in its group
    specs["layers.12.experts.3.down"] = ((1,), torch.float32)
    info = inspect_model(module_with(specs))
    with pytest.raises(IndexGapError) as bulk_error:
        route.route_checkpoint(_keys(*_experts()), [_MERGE, _STACK], info)
    with pytest.raises(IndexGapError) as exact:
        _exact(_keys(*_experts()), [_MERGE, _STACK], info, monkeypatch)
    assert str(bulk_error.value) == str(exact.value)
    assert "indices [3] are missing" in str(exact.value)


def test_a_group_split_between_runs_and_single_routes_is_grouped_the_exact_way(monkeypatch):
    # only experts 10 and 11 of layer 1's gate and up keys need the renaming: their group
    # has keys in runs (0..9) and the rest routed one by one (10, 11), which alone look
    # like a group with a gap; the exact grouping sees them all
    rename = WeightRenaming(r"\.(gate|up)per$", r".\1")
    names = [n.replace(".up", ".upper").replace(".gate", ".gateper")
             if n.startswith(("layers.1.experts.10.", "layers.1.experts.11.")) else n
             for n in _experts()]
    bulk = _same(names, [rename, _MERGE, _STACK], monkeypatch)
    assert len(bulk.groups) == 6


def test_a_stream_whose_runs_interleave_is_ordered_one_by_one(monkeypatch):
    # routed one by one in checkpoint order (reversed here), a stream's keys come as one
    # run 11, 10, ..., 0: not 0..n-1 once joined, so they are sorted one by one
    names = _experts(parts=("down",))[::-1]
    said = _one_by_one(monkeypatch)
    exact = _exact(_keys(*names), [_STACK], None, monkeypatch)
    assert said == {"runs": 0, "one by one": 3}
    assert exact == route.route_checkpoint(_keys(*names), [_STACK], None)
    assert said == {"runs": 3, "one by one": 3}
    assert [[e.key for e in g.sources[0]] for g in exact.groups][0] == [
        f"layers.0.experts.{e}.down" for e in range(12)]
