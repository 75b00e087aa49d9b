"""Phase 1 routing: rename order, first converter wins, groups, gaps, conflicts, fix-ups."""

import pytest
import torch

import weightplan
from weightplan import PrefixChange, WeightConverter, WeightRenaming
from weightplan.errors import ConflictingTransformError, IndexGapError, MappingError
from weightplan.ops import Concatenate, MergeModulelist, Transpose
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.keys.route import route_checkpoint

from tests.conftest import module_with


def ones(*keys, shape=(2, 2)):
    return {k: torch.ones(shape) for k in keys}


def routes(ckpt, transforms, model=None):
    from weightplan.planner.inputs.model_info import inspect_model
    info = inspect_model(model) if model is not None else None
    return route_checkpoint(open_checkpoint(ckpt), transforms, info)


def test_every_renaming_fires_in_order_then_first_converter_claims():
    t = [WeightRenaming("a", "b"), WeightRenaming("b", "c"),
         WeightConverter("c.x", "first", [Transpose()]), WeightConverter("c", "second", [Transpose()])]
    (route,) = routes(ones("a.x"), t).routes
    assert route.renamed == "c.x"
    assert [r.source_patterns for r in route.fired] == [("a",), ("b",)]
    assert route.converter.target_patterns == ("first",)


def test_renamings_run_before_converters_whatever_the_list_order():
    t = [WeightConverter("mlp.x", "y", [Transpose()]), WeightRenaming("moe", "mlp")]
    (route,) = routes(ones("moe.x"), t).routes
    assert route.converter is not None and route.renamed == "mlp.x"


def test_groups_collect_by_numeric_index_order():
    keys = [f"l.0.experts.{e}.w1" for e in (10, 2, 0, 1, 3, 4, 5, 6, 7, 8, 9)]
    conv = WeightConverter(".experts.*.w1", ".experts.w", [MergeModulelist(0)])
    (group,) = routes(ones(*keys), [conv]).groups
    assert [e.key for e in group.sources[0]] == [f"l.0.experts.{e}.w1" for e in range(11)]
    assert group.targets == ("l.0.experts.w",)


def test_index_gap_is_a_plan_time_error_naming_indices():
    keys = [f"l.0.experts.{e}.w1" for e in (0, 1, 2, 4)]
    conv = WeightConverter(".experts.*.w1", ".experts.w", [MergeModulelist(0)])
    with pytest.raises(IndexGapError, match=r"indices \[3\] are missing"):
        routes(ones(*keys), [conv])


def test_different_counts_across_patterns_is_a_gap():
    keys = [f"e.{i}.w1" for i in range(3)] + [f"e.{i}.w3" for i in range(2)]
    conv = WeightConverter(["e.*.w1", "e.*.w3"], "gu", [MergeModulelist(0), Concatenate(1)])
    with pytest.raises(IndexGapError, match="different counts"):
        routes(ones(*keys), [conv])


def test_two_converters_same_pattern_is_a_conflict():
    t = [WeightConverter("x", "a", [Transpose()]), WeightConverter("x", "b", [Transpose()])]
    with pytest.raises(ConflictingTransformError, match="two converters claim"):
        routes(ones("x"), t)


def test_renaming_that_targets_a_converter_output_is_a_conflict():
    t = [WeightConverter(".experts.*.w1", ".experts.gate_up_proj", [MergeModulelist(0)]),
         WeightRenaming("gate_up_proj", "fused")]
    with pytest.raises(ConflictingTransformError, match="renamings run before converters"):
        routes(ones("experts.0.w1"), t)


def test_incomplete_group_is_reported_not_raised():
    keys = [f"e.{i}.w1" for i in range(2)]
    conv = WeightConverter(["e.*.w1", "e.*.w3"], "gu", [MergeModulelist(0), Concatenate(1)])
    routing = routes(ones(*keys), [conv])
    assert routing.groups == () and routing.incomplete[0].missing_patterns == ("e.*.w3",)
    said = f"{conv.describe()}: found e.0.w1, e.1.w1 but nothing for e.*.w3"
    assert routing.incomplete[0].describe() == said
    with pytest.raises(MappingError) as error:
        routing.require_complete("inverse ")  # where a group can't be skipped (saves)
    assert str(error.value) == "inverse " + said
    routes(ones(*keys, "e.0.w3", "e.1.w3"), [conv]).require_complete()


def test_scoped_converter_only_sees_its_subtree():
    conv = WeightConverter("fc.weight", "proj.weight", [Transpose()]).with_scope("vision")
    r = routes(ones("vision.fc.weight", "text.fc.weight"), [conv])
    by_key = {x.key: x for x in r.routes}
    assert by_key["vision.fc.weight"].converter is not None
    assert by_key["text.fc.weight"].converter is None
    group = next(g for g in r.groups if g.converter is not None)
    assert group.targets == ("vision.proj.weight",)


def test_base_model_prefix_fix_up_is_recorded():
    model = module_with({"model.layers.0.w": ((2, 2), torch.float32)})
    model.base_model_prefix = "model"
    (route,) = routes(ones("layers.0.w"), [], model).routes
    assert route.renamed == "model.layers.0.w"
    assert route.fired == (PrefixChange(prefix_to_add="model"),)
    assert "base_model_prefix" in route.note


def test_original_name_kept_when_the_transformed_one_is_unknown():
    model = module_with({"enc.LayerNorm.gamma": ((2,), torch.float32)})
    plan = weightplan.explain(model, {"enc.LayerNorm.gamma": torch.ones(2)},
                              mapping=[WeightRenaming(r"\.gamma$", ".weight")])
    assert not plan.missing and not plan.unexpected
    assert any("kept its checkpoint name" in n.message for n in plan.notes)
