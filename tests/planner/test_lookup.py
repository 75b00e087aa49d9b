"""The depth-first mapping lookup (SPEC §5): class name first, then model_type, scoped to
the submodule's path, ancestors' claims skip, siblings keep their own scope."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import weightplan
from weightplan import PrefixChange, WeightConverter, WeightRenaming
from weightplan.errors import ConflictingTransformError
from weightplan.ops import Concatenate, MergeModulelist, Transpose
from weightplan.planner.keys.lookup import is_submodel, lookup_mapping
from weightplan.planner.keys.registry import MappingRegistry, Via


def cfg(model_type):
    return SimpleNamespace(model_type=model_type)


class Tower(nn.Module):
    def __init__(self, model_type="tower_type"):
        super().__init__()
        self.config = cfg(model_type)
        self.fc = nn.Linear(2, 2)


class Composite(nn.Module):
    def __init__(self, model_type="composite_type"):
        super().__init__()
        self.config = cfg(model_type)
        self.vision = Tower()
        self.audio = Tower()


@pytest.fixture
def registry():
    r = MappingRegistry()
    r.register("tower_type", [WeightRenaming(r"^old\.", "fc.")])
    r.register("composite_type", [WeightRenaming(r"^v\.", "vision.")])
    return r


def test_root_mapping_is_unscoped_and_siblings_get_their_own_scope(registry):
    choice = lookup_mapping(Composite(), registry)
    assert [(s.path, s.identifier, s.via) for s in choice.submodules] == [
        ("", "composite_type", Via.MODEL_TYPE), ("vision", "tower_type", Via.MODEL_TYPE),
        ("audio", "tower_type", Via.MODEL_TYPE)]
    assert [t.scope_prefix for t in choice.transforms] == [None, "vision", "audio"]
    assert choice.key == "composite_type"
    vision = choice.transforms[1]
    assert vision.rename("vision.old.weight") == "vision.fc.weight"
    assert vision.rename("audio.old.weight") is None


def test_root_renamings_run_before_the_scoped_ones(registry):
    choice = lookup_mapping(Composite(), registry)
    key = "v.old.weight"
    for t in choice.transforms:
        key = t.rename(key) or key
    assert key == "vision.fc.weight"


def test_class_name_wins_over_model_type(registry):
    registry.register("Tower", [WeightRenaming("a", "b")])
    choice = lookup_mapping(Composite(), registry)
    assert [(s.path, s.identifier, s.via) for s in choice.submodules[1:]] == [
        ("vision", "Tower", Via.CLASS), ("audio", "Tower", Via.CLASS)]


def test_an_ancestor_claim_skips_the_same_identifier_below():
    registry = MappingRegistry()
    registry.register("tower_type", [WeightRenaming("a", "b")])
    root = Tower()
    root.inner = Tower()
    root.inner.deeper = Tower()
    choice = lookup_mapping(root, registry)
    skipped = [s for s in choice.submodules if not s.applied]
    assert [(s.path, s.skipped_for) for s in skipped] == [("inner", "")]  # recorded once
    assert len(choice.transforms) == 1
    assert "skipped, class Tower already claimed by <root>" in skipped[0].describe()


def test_a_class_hit_leaves_the_model_type_free():
    registry = MappingRegistry()
    registry.register("Composite", [WeightRenaming("x", "y")])
    registry.register("composite_type", [WeightRenaming("p", "q")])
    root = Composite()
    root.inner = Tower("composite_type")  # same model_type, no class mapping
    choice = lookup_mapping(root, registry)
    assert [(s.path, s.via, s.applied) for s in choice.submodules] == [
        ("", Via.CLASS, True), ("inner", Via.MODEL_TYPE, True)]
    assert choice.transforms[1].scope_prefix == "inner"


def test_a_model_type_hit_claims_it_for_the_subtree():
    registry = MappingRegistry()
    registry.register("composite_type", [WeightRenaming("p", "q")])
    root = Composite()
    root.vision.inner = Tower("composite_type")
    choice = lookup_mapping(root, registry)
    assert [(s.path, s.applied) for s in choice.submodules] == [("", True),
                                                                ("vision.inner", False)]


def test_a_sibling_claim_does_not_skip():
    registry = MappingRegistry()
    registry.register("Tower", [WeightRenaming("a", "b")])
    root = nn.Module()
    root.left, root.right = Tower(), Tower()
    root.left.nested = Tower()
    choice = lookup_mapping(root, registry)
    assert [(s.path, s.applied) for s in choice.submodules] == [
        ("left", True), ("left.nested", False), ("right", True)]


def test_aliases_are_followed_and_named(registry):
    registry.alias("vision_alias", "tower_type")
    choice = lookup_mapping(Tower("vision_alias"), registry)
    (entry,) = choice.submodules
    assert (entry.identifier, entry.key) == ("vision_alias", "tower_type")
    assert "model_type 'vision_alias' (alias of 'tower_type')" in choice.reason


def test_nested_scopes_nest():
    registry = MappingRegistry()
    registry.register("tower_type", [WeightRenaming("a", "b", scope_prefix="fc")])
    root = nn.Module()
    root.tower = Tower()
    (t,) = lookup_mapping(root, registry).transforms
    assert t.scope_prefix == "tower.fc"


def test_modules_of_transformers_that_are_not_submodels_are_not_looked_up_by_model_type():
    class Attention(nn.Module):  # a transformers layer holding its model's config
        def __init__(self):
            super().__init__()
            self.config = cfg("tower_type")

    Attention.__module__ = "transformers.models.fake.modeling_fake"
    assert not is_submodel(Attention()) and is_submodel(Tower())
    registry = MappingRegistry()
    registry.register("tower_type", [WeightRenaming("a", "b")])
    root = nn.Module()
    root.attn = Attention()
    assert lookup_mapping(root, registry).submodules == ()


def test_two_mappings_converting_one_submodule_differently_are_ambiguous():
    registry = MappingRegistry()
    merge = [MergeModulelist(0), Concatenate(1)]
    registry.register("composite_type", [WeightConverter(["e.*.w1", "e.*.w3"], "e.gate_up", merge)])
    registry.register("Tower", [WeightConverter("e.*.w1", "e.w1", [MergeModulelist(0)])])
    with pytest.raises(ConflictingTransformError) as e:
        lookup_mapping(Composite(), registry)
    message = str(e.value)
    assert "model_type 'composite_type'" in message and "class Tower" in message
    assert "vision" in message and "'e.*.w1'" in message


def test_the_same_converter_in_two_mappings_is_not_ambiguous():
    registry = MappingRegistry()
    same = [WeightConverter("e.*.w2", "e.down", [MergeModulelist(0)])]
    registry.register("composite_type", same)
    registry.register("Tower", same)
    assert len(lookup_mapping(Composite(), registry).applied) == 3


def test_no_mapping_anywhere_says_so():
    choice = lookup_mapping(Tower("unknown_type"), MappingRegistry())
    assert choice.key is None and choice.transforms == ()
    assert "no registered mapping for class Tower, model_type 'unknown_type'" in choice.reason


class TinyVLM(nn.Module):
    """A composite whose sub-model keeps an old ``vision_model.`` level in checkpoints."""

    def __init__(self):
        super().__init__()
        self.config = cfg("test_lookup_vlm")
        self.model = nn.Module()
        self.model.tower = Tower("test_lookup_tower")
        self.model.lm = nn.Linear(2, 3)


def register_tiny_vlm():
    weightplan.register_mapping("test_lookup_vlm", [
        WeightRenaming(r"^tower(?=\.)", "model.tower"),
        WeightRenaming(r"^lm(?=\.)", "model.lm")], overwrite=True)
    weightplan.register_mapping("test_lookup_tower",
                                [PrefixChange(prefix_to_remove="vision_model")], overwrite=True)


LEGACY_NAMES = {"tower.vision_model.fc": "model.tower.fc", "lm": "model.lm"}


def tiny_vlm_checkpoint(legacy: bool):
    g = torch.Generator().manual_seed(0)
    shapes = {"model.tower.fc.weight": (2, 2), "model.tower.fc.bias": (2,),
              "model.lm.weight": (3, 2), "model.lm.bias": (3,)}
    current = {k: torch.randn(*shape, generator=g) for k, shape in shapes.items()}
    if not legacy:
        return current, current
    old = {v: k for k, v in LEGACY_NAMES.items()}
    return {old[k.rsplit(".", 1)[0]] + "." + k.rsplit(".", 1)[1]: v
            for k, v in current.items()}, current


@pytest.mark.parametrize("legacy", [True, False], ids=["legacy", "current"])
def test_explain_applies_scoped_mappings_and_leaves_converted_keys_alone(legacy):
    register_tiny_vlm()
    ckpt, expected = tiny_vlm_checkpoint(legacy)
    model = TinyVLM()
    plan = weightplan.explain(model, ckpt)
    assert not plan.missing and not plan.unexpected, str(plan)
    text = str(plan)
    assert "model.tower (Tower): model_type 'test_lookup_tower'" in text
    assert "scoped to model.tower.*" in text
    data = plan.to_dict()["mapping"]
    assert [s["path"] for s in data["submodules"]] == ["", "model.tower"]
    plan.execute()
    got = model.state_dict()
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


def test_a_model_with_no_mapping_is_loaded_as_is_and_the_plan_says_so():
    model = Tower("test_lookup_unknown")
    plan = weightplan.explain(model, {"fc.weight": torch.ones(2, 2), "fc.bias": torch.ones(2)})
    assert plan.mapping.key is None and not plan.missing
    assert any("no registered mapping" in n.message for n in plan.notes)
    assert "no registered mapping for class Tower, model_type 'test_lookup_unknown'" in str(plan)


def test_a_scoped_renaming_sees_keys_saved_without_the_base_model_prefix():
    model = nn.Module()
    model.base_model_prefix = "model"
    model.model = nn.Module()
    model.model.tower = nn.Linear(2, 2)
    rename = WeightRenaming(r"^old\.", "").with_scope("model.tower")
    plan = weightplan.explain(model, {"tower.old.weight": torch.ones(2, 2),
                                      "model.tower.bias": torch.ones(2)}, mapping=[rename])
    assert not plan.missing and not plan.unexpected, str(plan)
    assert any("added before the renamings" in n.message for n in plan.notes)


def test_requested_mapping_skips_the_lookup():
    plan = weightplan.explain(Tower("test_lookup_unknown"), {"fc.weight": torch.ones(2, 2)},
                              mapping=[WeightConverter("fc.weight", "fc.weight", [Transpose()])])
    assert plan.mapping.submodules == () and not plan.notes


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = cfg("test_lookup_encoder")
        self.embeddings = nn.Module()
        self.embeddings.cls_token = nn.Parameter(torch.zeros(2))


class _WithHead(nn.Module):
    base_model_prefix = "enc"

    def __init__(self):
        super().__init__()
        self.config = cfg("test_lookup_with_head")
        self.enc = _Encoder()
        self.head = nn.Module()  # the head's own, renamed too, as transformers does
        self.head.embeddings = nn.Module()
        self.head.embeddings.cls_token = nn.Parameter(torch.zeros(2))


def test_the_base_models_renamings_rename_each_key_once():
    """transformers runs the base model's mapping once per key, its prefix optional: a
    renaming whose target holds its source (``cls_token`` → ``embeddings.cls_token``) gives
    ``enc.embeddings.cls_token``. Was: the copy for the head's keys renamed it again,
    ``enc.embeddings.embeddings.cls_token``, unexpected."""
    from weightplan.planner.inputs.checkpoint import open_checkpoint
    from weightplan.planner.inputs.model_info import inspect_model
    from weightplan.planner.keys.route import route_checkpoint

    registry = MappingRegistry()
    registry.register("test_lookup_encoder", [WeightRenaming("cls_token", "embeddings.cls_token")])
    model = _WithHead()
    choice = lookup_mapping(model, registry)
    routing = route_checkpoint(open_checkpoint({"enc.cls_token": torch.ones(2),
                                                "head.cls_token": torch.ones(2)}),
                               choice.transforms, inspect_model(model))
    assert {r.key: r.renamed for r in routing.routes} == {
        "enc.cls_token": "enc.embeddings.cls_token", "head.cls_token": "head.embeddings.cls_token"}
    assert "rename cls_token → embeddings.cls_token outside enc.*" in [
        t.describe() for t in choice.transforms]
