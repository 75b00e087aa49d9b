"""transformers' pattern dialect → weightplan's: the same keys match, the same key comes out."""

import pytest

from weightplan import WeightConverter, WeightRenaming
from weightplan.bridge.dialect import source_pattern, target_pattern, with_group
from weightplan.errors import PatternError
from weightplan.ops import MergeModulelist
from weightplan.planner.keys.patterns import compile_source


def matches(pattern: str, key: str) -> bool:
    return compile_source(source_pattern(pattern)).search(key) is not None


def test_a_whole_component_star_stays_the_index_wildcard():
    assert source_pattern(".experts.*.w1.weight") == r".experts.*.w1.weight(?!\w)"
    source = compile_source(source_pattern(".experts.*.w1.weight"))
    assert source.has_index and source.search("m.layers.0.experts.12.w1.weight").index == 12


def test_a_star_inside_a_component_or_leading_means_anything():
    assert matches("ngram_embedding.shard_*.weight", "ngram_embedding.shard_7.weight")
    assert not compile_source(source_pattern("ngram_embedding.shard_*.weight")).has_index
    assert matches("*.weight", "a.b.c.weight")
    assert not compile_source(source_pattern("*.weight")).has_index


def test_a_name_boundary_is_appended_as_transformers_does():
    assert matches("mlp.experts.*.gate_proj.weight", "mlp.experts.0.gate_proj.weight")
    assert not matches("mlp.experts.*.gate_proj.weight", "mlp.experts.0.gate_proj.weight_scale_inv")
    assert not matches("^language_model", "language_model_head.weight")
    assert source_pattern(r"\.block_sparse_moe\.") == r"\.block_sparse_moe\."


def test_escapes_are_kept():
    assert source_pattern(r"\*.x") == r"\*.x(?!\w)"


def test_targets_lose_anchors_lookarounds_and_groups():
    assert target_pattern(r"^model.language_model") == ("model.language_model", None)
    assert target_pattern(r"(?<!x)layers.") == ("layers.", None)
    assert target_pattern(r"tracker_model.(.+)") == (r"tracker_model.\1", "(.+)")
    with pytest.raises(PatternError):
        target_pattern("a[bc]")


def test_a_source_back_reference_takes_the_targets_group():
    assert with_group(r"\1", "(.+)") == "(.+)"
    assert with_group("plain", None) == "plain"
    with pytest.raises(PatternError):
        with_group(r"x.\1", None)


def test_translated_patterns_rename_like_transformers():
    rename = WeightRenaming(source_pattern(".block_sparse_moe."), target_pattern(".mlp.")[0])
    key = "model.layers.3.block_sparse_moe.gate.weight"
    assert rename.rename(key) == "model.layers.3.mlp.gate.weight"
    conv = WeightConverter(source_pattern(".experts.*.w2.weight"), ".experts.down_proj",
                           [MergeModulelist(0)])
    m = conv.match("model.layers.3.mlp.experts.5.w2.weight")
    assert conv.target_keys(m) == ("model.layers.3.mlp.experts.down_proj",)
