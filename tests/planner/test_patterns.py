import pytest

from weightplan.errors import NotInvertibleError, PatternError
from weightplan.planner.keys.patterns import (
    compile_source, compile_target, natural_key, source_to_target, target_to_source,
)


def test_index_wildcard_matches_one_numeric_component():
    p = compile_source(".experts.*.w1.weight")
    m = p.search("model.layers.0.mlp.experts.12.w1.weight")
    assert m.index == 12 and m.groups == ()
    assert p.search("model.layers.0.mlp.experts.x.w1.weight") is None
    assert p.search("model.experts.1.2.w1.weight") is None


def test_star_not_between_dots_stays_a_regex_quantifier():
    p = compile_source("language_model.*")
    assert not p.has_index
    assert p.search("model.language_model.layers.0.w") is not None


def test_user_groups_are_numbered_without_the_wildcard():
    p = compile_source(r"layers\.(\d+)\.experts\.*\.(w\d)")
    m = p.search("layers.3.experts.5.w1")
    assert m.groups == ("3", "w1") and m.index == 5


def test_two_wildcards_are_refused():
    with pytest.raises(PatternError, match="2 index wildcards"):
        compile_source("layers.*.experts.*.w1")


def test_invalid_regex_names_the_pattern():
    with pytest.raises(PatternError, match=r"'a\(b'"):
        compile_source("a(b")


def test_target_expansion_groups_index_and_escapes():
    t = compile_target(r"^blocks.\1.experts.*.gate\.proj$")
    assert t.expand(("3",), 7) == "blocks.3.experts.7.gate.proj"
    assert t.expand(("3",), "*") == "blocks.3.experts.*.gate.proj"


@pytest.mark.parametrize("bad", ["a(b)", "x[0]", "a|b", "w+"])
def test_targets_must_be_literal(bad):
    with pytest.raises(PatternError, match="literal"):
        compile_target(bad)


def test_missing_group_reference_raises():
    with pytest.raises(PatternError, match=r"\\2"):
        compile_target(r"a.\2").expand(("x",))


def test_natural_key_orders_numbers_numerically():
    keys = ["e.10.w", "e.9.w", "e.1.w", "a.w"]
    assert sorted(keys, key=natural_key) == ["a.w", "e.1.w", "e.9.w", "e.10.w"]


def test_source_to_target_and_back():
    assert source_to_target(r"^layers\.(\d+)\.attn$") == r"layers.\1.attn"
    assert source_to_target(r"(?<!vision\.)layers\.") == "layers."
    assert source_to_target(".experts.*.w1.weight") == ".experts.*.w1.weight"
    src = compile_source(r"layers\.(\d+)\.attn")
    assert target_to_source(compile_target(r"blocks.\1.x"), src) == r"blocks\.(\d+)\.x"


@pytest.mark.parametrize("pattern", [r"layers\.\d+", "a.*b", "(?:a|b)c", "[ab]c"])
def test_source_to_target_refuses_non_literals(pattern):
    with pytest.raises(NotInvertibleError):
        source_to_target(pattern)
