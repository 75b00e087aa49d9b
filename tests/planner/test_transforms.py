import pytest

from weightplan import PrefixChange, WeightConverter, WeightRenaming
from weightplan.errors import MappingError, NotInvertibleError, PatternError
from weightplan.ops import Chunk, Concatenate, MergeModulelist, SplitModulelist, Transpose


def test_renaming_replaces_only_the_matched_substring():
    r = WeightRenaming(".block_sparse_moe.", ".mlp.")
    assert r.rename("model.layers.3.block_sparse_moe.gate.weight") == "model.layers.3.mlp.gate.weight"
    assert r.rename("model.layers.3.self_attn.q_proj.weight") is None


def test_renaming_with_groups_and_pairwise_targets():
    r = WeightRenaming([r"h\.(\d+)\.attn", r"h\.(\d+)\.mlp"], [r"layers.\1.self_attn", r"layers.\1.ffn"])
    assert r.rename("h.4.attn.c.weight") == "layers.4.self_attn.c.weight"
    assert r.rename("h.4.mlp.c.weight") == "layers.4.ffn.c.weight"


def test_renaming_target_star_keeps_the_index():
    r = WeightRenaming("experts.*.w1", "experts.*.gate_proj")
    assert r.rename("m.experts.11.w1.weight") == "m.experts.11.gate_proj.weight"


def test_scope_prefix_restricts_and_is_put_back():
    r = WeightRenaming("^encoder.", "blocks.", scope_prefix="vision_model")
    assert r.rename("vision_model.encoder.x") == "vision_model.blocks.x"
    assert r.rename("text_model.encoder.x") is None
    assert r.rename("encoder.x") is None


def test_with_scope_nests():
    r = WeightRenaming("a", "b", scope_prefix="inner").with_scope("outer")
    assert r.scope_prefix == "outer.inner"
    assert r.rename("outer.inner.a") == "outer.inner.b"


def test_prefix_change_add_is_idempotent():
    p = PrefixChange(prefix_to_add="model")
    assert p.rename("layers.0.w") == "model.layers.0.w"
    assert p.rename("model.layers.0.w") is None


def test_prefix_change_remove_under_model_prefix():
    p = PrefixChange(prefix_to_remove="bad_prefix", model_prefix="model.layers")
    assert p.rename("model.layers.bad_prefix.weight") == "model.layers.weight"
    assert p.rename("model.other.bad_prefix.weight") is None


def test_prefix_change_needs_exactly_one_direction():
    with pytest.raises(MappingError):
        PrefixChange()
    with pytest.raises(MappingError):
        PrefixChange(prefix_to_add="a", prefix_to_remove="b")


def test_prefix_change_inverse():
    p = PrefixChange(prefix_to_add="model", model_prefix="vlm")
    assert p.inverse() == PrefixChange(prefix_to_remove="model", model_prefix="vlm")
    assert p.inverse().rename(p.rename("vlm.x.y")) == "vlm.x.y"


def test_converter_match_and_targets_keep_suffix():
    c = WeightConverter([".experts.*.w1.weight", ".experts.*.w3.weight"], ".experts.gate_up_proj",
                        [MergeModulelist(0), Concatenate(1)])
    m = c.match("model.layers.2.mlp.experts.5.w3.weight_scale_inv")
    assert (m.source_index, m.match.index, m.tail) == (1, 5, "_scale_inv")
    assert c.target_keys(m) == ("model.layers.2.mlp.experts.gate_up_proj_scale_inv",)


def test_converter_validation():
    with pytest.raises(MappingError, match="non-empty list of ConversionOp"):
        WeightConverter("a", "b", [])
    with pytest.raises(MappingError, match="many-to-many"):
        WeightConverter(["a", "b"], ["c", "d"], [Transpose()])
    with pytest.raises(PatternError, match=r"\\1"):
        WeightConverter("a", r"b.\1", [Transpose()])


def test_converter_inverse_reverses_and_inverts_ops():
    c = WeightConverter([".experts.*.w1.weight", ".experts.*.w3.weight"], ".experts.gate_up_proj",
                        [MergeModulelist(0), Concatenate(1)])
    inv = c.inverse()
    assert inv.operations == (Chunk(1), SplitModulelist(0))
    assert inv.target_patterns == (".experts.*.w1.weight", ".experts.*.w3.weight")
    assert inv.match("model.layers.0.mlp.experts.gate_up_proj") is not None


def test_renaming_inverse_round_trips_groups():
    r = WeightRenaming(r"layers\.(\d+)\.attn", r"blocks.\1.attention")
    key = "x.layers.3.attn.q"
    assert r.inverse().rename(r.rename(key)) == key


def test_ambiguous_inverse_is_refused():
    with pytest.raises(NotInvertibleError, match="several sources"):
        WeightRenaming(["a", "b"], "c").inverse()
    with pytest.raises(NotInvertibleError):
        WeightRenaming(r"layer\d+", "block").inverse()


def test_transforms_are_hashable_and_equal_by_value():
    a = WeightRenaming("x", "y")
    assert a == WeightRenaming("x", "y") and hash(a) == hash(WeightRenaming("x", "y"))
    assert WeightRenaming("x", ["y"]) == a


def test_a_target_group_the_source_lacks_is_counted_in_words():
    """Was: 'captures only 1 group(s)'."""
    with pytest.raises(PatternError) as e:
        WeightRenaming(r"layers\.(\d+)\.w", r"blocks.\2.w")
    assert str(e.value).endswith("captures only 1 group"), str(e.value)
