"""Key templates: digit-blindness, natural order from sort texts, and routing once per
template giving exactly the routes of routing every key by itself."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weightplan import PrefixChange, WeightConverter, WeightRenaming
from weightplan.ops import Concatenate, MergeModulelist
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.inputs.model_info import inspect_model
from weightplan.planner.keys import route, router
from weightplan.planner.keys.applier import Applier
from weightplan.planner.keys.mappings import REGISTRY
from weightplan.planner.keys.patterns import natural_key
from weightplan.planner.keys.templates import (
    digit_blind, natural_order, sort_texts, template_of, templates_of,
)
from weightplan.planner.keys.transforms import LEGACY, Renaming

from tests.conftest import module_with


def test_template_keeps_digit_positions_and_refuses_leading_zeros():
    assert template_of("model.layers.12.experts.3.w1") == "model.layers.11.experts.1.w1"
    assert template_of("layers.12.experts.3.w2.fc20x.3a") == "layers.11.experts.1.w2.fc20x.3a"
    assert template_of("h.007.w") is None
    assert template_of("h.0.w") == "h.1.w"


@pytest.mark.parametrize("transform, blind", [
    (WeightRenaming(r"layers\.(\d+)\.", r"blocks.\1."), True),
    (WeightRenaming(r"layers\.1\.", "first."), False),  # a literal digit
    (WeightRenaming(r"h\.(\d{2})\.", r"h.\1."), False),  # a counted quantifier
    (WeightRenaming("attn", "attention", scope_prefix="model.layers.0"), False),
    (WeightRenaming("gamma", "weight2"), True),  # a digit in the target: the same in all
    (WeightConverter(".experts.*.w1", ".experts.gate", [MergeModulelist(0)]), True),
    (WeightRenaming(r"fc12\.(\d+)", r"b.\1"), True),  # digits inside a name
    (WeightRenaming(r"w?1", "x"), False),  # a digit that may stand alone
    (WeightRenaming(r"[w1]", "x"), False),  # a digit in a class
    (WeightRenaming(r"w[^0]", "x"), False),
    (WeightRenaming(r"w\x31", "x"), False),  # a digit by its code
    (WeightRenaming(r"w\N{DIGIT ONE}", "x"), False),
    (WeightRenaming(r"\.(?P<a>\d)\.(?P=a)", "x"), False),  # a back-reference by name
    (WeightRenaming(r"w\d1", "x"), False),
    (PrefixChange(prefix_to_add="model"), True),
    (PrefixChange(prefix_to_remove="model2"), False),
])
def test_digit_blindness(transform, blind):
    assert digit_blind(transform) is blind


def _both(checkpoint, transforms, model, monkeypatch):
    fast = route.route_checkpoint(checkpoint, transforms, model)
    with monkeypatch.context() as m:
        m.setattr(router, "templates_of", lambda keys: [None] * len(keys))  # key by key
        slow = route.route_checkpoint(checkpoint, transforms, model)
    return fast, slow


def _keys(*names):
    return open_checkpoint({k: torch.zeros(1) for k in names})


def test_swapped_groups_fall_back_where_the_template_cannot_tell(monkeypatch):
    swap = WeightRenaming(r"layers\.(\d+)\.experts\.(\d+)\.", r"layers.\2.experts.\1.")
    ckpt = _keys("layers.3.experts.3.w", "layers.12.experts.3.w", "layers.11.experts.22.w",
                 "layers.22.experts.11.w", "layers.5.experts.10.w")
    fast, slow = _both(ckpt, [swap], None, monkeypatch)
    assert fast == slow
    renamed = {r.key: r.renamed for r in fast.routes}
    assert renamed["layers.11.experts.22.w"] == "layers.22.experts.11.w"
    assert renamed["layers.3.experts.3.w"] == "layers.3.experts.3.w"


def test_moe_routes_with_prefix_fixups_equal_the_slow_path(monkeypatch):
    names = [f"layers.{i}.block_sparse_moe.experts.{e}.{w}.weight"
             for i in range(3) for e in range(12) for w in ("w1", "w2", "w3")]
    names += [f"layers.{i}.block_sparse_moe.gate.weight" for i in range(3)]
    names += ["layers.0.LayerNorm.gamma", "layers.07.odd", "lm_head.weight", "extra.9.x"]
    ckpt = _keys(*names)
    specs = {f"model.layers.{i}.mlp.experts.gate_up_proj": ((12, 2, 1), torch.float32)
             for i in range(3)}
    specs.update({f"model.layers.{i}.mlp.experts.down_proj": ((12, 1, 1), torch.float32)
                  for i in range(3)})
    specs.update({"model.layers.0.LayerNorm.weight": ((1,), torch.float32),
                  "lm_head.weight": ((1,), torch.float32)})
    model = module_with(specs)
    model.base_model_prefix = "model"
    info = inspect_model(model)
    transforms = tuple(REGISTRY.get("mixtral")) + LEGACY
    fast, slow = _both(ckpt, transforms, info, monkeypatch)
    assert fast == slow
    notes = {r.key: r.note for r in fast.routes}
    assert "added" in notes["layers.2.block_sparse_moe.experts.11.w3.weight"]
    assert notes["lm_head.weight"] == ""


def test_converter_with_groups_rebuilds_the_real_match(monkeypatch):
    conv = WeightConverter([r"blocks\.(\d+)\.e\.*\.a", r"blocks\.(\d+)\.e\.*\.b"],
                           r"blocks.\1.ab", operations=[MergeModulelist(0), Concatenate(1)])
    ckpt = _keys(*[f"m.blocks.{i}.e.{e}.{w}" for i in (1, 10, 234) for e in range(11)
                   for w in "ab"])
    fast, slow = _both(ckpt, [conv], None, monkeypatch)
    assert fast == slow
    assert {g.targets for g in fast.groups} == {("m.blocks.1.ab",), ("m.blocks.10.ab",),
                                               ("m.blocks.234.ab",)}


_PARTS = st.sampled_from(["a", "w1", "1x", "0", "7", "10", "99", "100", "", "%s", "-", "Z",
                          "007", "\u0663", "a\nb", "\x01"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_PARTS, min_size=1, max_size=5).map(".".join), max_size=30,
                unique=True))
def test_bulk_templates_and_natural_order_agree_with_the_per_key_ones(keys):
    # both ways natural_order sorts (sort texts; natural_key where some key can't have
    # one) give natural_key's order, ties kept in the order the batches came
    templates = templates_of(keys)
    assert templates == [template_of(k) for k in keys]
    batches: dict = {}
    for key, template in zip(keys, templates, strict=True):
        batches.setdefault(template, []).append(key)
    for template, members in batches.items():
        if template is not None:
            members.sort()
    flat = [k for members in batches.values() for k in members]
    order = natural_order(list(batches.items()))
    assert [flat[i] for i in order] == sorted(flat, key=natural_key)
    # and as keys sharing no template (the joined text's sort texts, leading zeros too)
    order = natural_order([(None, flat)])
    assert [flat[i] for i in order] == sorted(flat, key=natural_key)


def test_sort_texts_order_numbers_by_value_and_shorter_keys_first():
    keys = ["e.10.w", "e.99.w", "e.11.w"]
    texts = sort_texts("e.11.w", keys)
    assert sorted(keys, key=dict(zip(keys, texts, strict=True)).__getitem__) == [
        "e.10.w", "e.11.w", "e.99.w"]
    assert sort_texts("a", ["a"]) < sort_texts("a.b", ["a.b"])


def test_routes_come_in_natural_key_order():
    names = ["layers.10.w", "", "layers.9.w", "layers.9.experts.11.w1", "layers.9.experts.2.w1",
             "a", "layers.9"]
    routed = route.route_checkpoint(_keys(*names), [], None)
    assert [r.key for r in routed.routes] == sorted(names, key=natural_key)


def test_digits_moved_into_a_name_fall_back_where_a_literal_could_reach_them(monkeypatch):
    # the template reads ``experts.1.w1``; the swap makes ``experts.3.w1`` read ``w3``,
    # which only the converter's literal ``w3`` tells apart
    swap = WeightRenaming(r"\.(\d+)\.w(\d)", r".\2.w\1")
    up = WeightConverter(r"\.w3$", ".up", [MergeModulelist(0)])
    ckpt = _keys(*[f"layers.{i}.experts.{e}.w1" for i in (1, 2) for e in range(5)])
    fast, slow = _both(ckpt, [swap, up], None, monkeypatch)
    assert fast == slow
    claimed = {r.key for r in fast.routes if r.converter is not None}
    assert claimed == {"layers.1.experts.3.w1", "layers.2.experts.3.w1"}


def test_mixtral_experts_are_decided_once_per_template():
    keys = [f"model.layers.{i}.block_sparse_moe.experts.{e}.w{w}.weight"
            for i in range(4) for e in range(8) for w in (1, 2, 3)]
    applier = Applier(*_split(REGISTRY.get("mixtral")), None)
    assert applier.blind
    for key in keys:
        assert applier.decision(template_of(key)) is not None
    assert len(applier.memo) == 3  # w1, w2, w3


def _split(transforms):
    renamings = [t for t in transforms if isinstance(t, Renaming)]
    return renamings, [t for t in transforms if isinstance(t, WeightConverter)]
