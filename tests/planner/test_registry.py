"""The registry: keys by model_type or class name, aliases, overwrite rules, built-ins."""

import pytest

import weightplan
from weightplan import WeightRenaming
from weightplan.errors import RegistryError
from weightplan.planner.keys.mappings import LLAVA_ALIASES, LLAVA_MODEL_ALIASES
from weightplan.planner.keys.registry import MappingRegistry


def test_register_get_and_overwrite():
    r = MappingRegistry()
    first = [WeightRenaming("a", "b")]
    r.register("fam", first)
    assert r.get("fam") == first and r.get("fam") is not first
    with pytest.raises(RegistryError, match="overwrite=True"):
        r.register("fam", [])
    r.register("fam", [], overwrite=True)
    assert r.get("fam") == []


def test_aliases_follow_chains_and_name_their_target():
    r = MappingRegistry()
    r.register("base", [WeightRenaming("a", "b")])
    r.alias("middle", "base")
    r.alias("outer", "middle")
    assert r.resolve("outer") == "base" and r.get("outer") == r.get("base")
    with pytest.raises(RegistryError, match="unknown mapping"):
        r.alias("dangling", "nothing")
    with pytest.raises(RegistryError, match="already registered"):
        r.alias("middle", "base")


def test_registering_over_an_alias_replaces_it():
    r = MappingRegistry()
    r.register("base", [WeightRenaming("a", "b")])
    r.alias("fam", "base")
    r.register("fam", [WeightRenaming("c", "d")], overwrite=True)
    assert r.resolve("fam") == "fam" and r.get("fam")[0].source_patterns == ("c",)


def test_unknown_keys_raise_naming_the_key():
    with pytest.raises(RegistryError, match="'no_such_family'"):
        weightplan.get_mapping("no_such_family")


def test_built_in_families_and_aliases():
    assert weightplan.get_mapping("minimax") == weightplan.get_mapping("mixtral")
    for alias in ("qwen3_moe", "olmoe", "deepseek_v3"):
        assert weightplan.get_mapping(alias) == weightplan.get_mapping("qwen2_moe")
    for alias in LLAVA_ALIASES:
        assert weightplan.get_mapping(alias) == weightplan.get_mapping("llava")
    for alias in LLAVA_MODEL_ALIASES:
        assert weightplan.get_mapping(alias) == weightplan.get_mapping("LlavaModel")


def test_llava_renames_are_anchored_and_leave_current_keys_alone():
    root, inner = weightplan.get_mapping("llava"), weightplan.get_mapping("LlavaModel")

    def apply(key):
        for t in root + [t.with_scope("model") for t in inner]:
            key = t.rename(key) or key
        return key

    assert apply("language_model.lm_head.weight") == "lm_head.weight"
    assert apply("language_model.model.layers.0.w") == "model.language_model.layers.0.w"
    assert apply("vision_tower.encoder.w") == "model.vision_tower.encoder.w"
    for current in ("lm_head.weight", "model.language_model.layers.0.w",
                    "model.vision_tower.encoder.w", "model.multi_modal_projector.linear_1.bias"):
        assert apply(current) == current
