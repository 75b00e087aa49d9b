"""The transformers bridge: every mapping transformers registers is translated or reported,
bridged families load like from_pretrained, and agree with the built-in ones."""

from collections import Counter

import pytest
import torch

import weightplan
from weightplan.planner.keys.lookup import lookup_mapping
from weightplan.planner.keys.registry import MappingRegistry, Source

from tests.interop.oracle import assert_same, load_both, rewrite, save

import transformers as T  # noqa: E402  (a dev dependency: always installed by `make test`)
from weightplan.bridge.transformers import (  # noqa: E402
    Coverage, TransformersFinder, translate_all, translate_mapping,
)

from tests.interop import families as vlm  # noqa: E402

# families whose transformers mapping weightplan runs exactly (built-in ones included)
KNOWN_GOOD = ("mixtral", "minimax", "minimax_m2", "qwen2_moe", "qwen3_moe", "olmoe",
              "deepseek_v3", "phimoe", "lfm2_moe", "jamba", "nemotron_h", "llava", "gemma3",
              "paligemma", "mistral3", "LlavaModel", "Gemma3Model", "CLIPVisionModel",
              "SiglipVisionModel", "llava_next", "qwen2_audio", "qwen3_vl_moe", "legacy")
# (family, what its problem must name): ops and transforms weightplan has no equivalent for
KNOWN_GAPS = (("ernie4_5_vl_moe", "ErnieFuseAndSplitTextVisionExperts"),
              ("dory", "LayerPairCollapse"), ("qwen4_exp_text", "num_shards_attribute"))


def test_every_registered_mapping_translates_or_is_reported(capsys):
    translations = {t.family: t for t in translate_all()}
    counts = Counter(t.coverage for t in translations.values())
    gaps = Counter(g for t in translations.values() for g in t.gaps)
    with capsys.disabled():
        print(f"\ntransformers bridge: {len(translations)} registered mappings, "
              f"{counts[Coverage.FULL]} translate fully, {counts[Coverage.PARTIAL]} partly, "
              f"{counts[Coverage.NONE]} not at all; left out: "
              + ", ".join(f"{name} ×{n}" for name, n in gaps.most_common()))
    for t in translations.values():
        assert len(t.transforms) + len(t.problems) == t.total, t.family  # nothing dropped
        assert len(t.gaps) == len(t.problems)
        assert all(f"transformers mapping {t.family!r}" in p for p in t.problems), t.problems
    for family in KNOWN_GOOD:
        assert translations[family].coverage is Coverage.FULL, translations[family].problems
    for family, name in KNOWN_GAPS:
        assert any(name in p for p in translations[family].problems), family
    assert counts[Coverage.FULL] >= 0.9 * len(translations)


def test_unknown_identifiers_are_not_bridged():
    assert translate_mapping("no_such_model_type") is None


def test_a_bridged_family_loads_like_from_pretrained(tmp_path):
    cls = T.PhimoeForCausalLM
    cfg = T.PhimoeConfig(vocab_size=96, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         num_local_experts=4, num_experts_per_tok=2)
    model, reference, plan = load_both(cls, cfg, save(cls, cfg, tmp_path))
    root = plan.mapping.applied[0]
    assert (root.identifier, root.source) == ("phimoe", Source.TRANSFORMERS)
    assert "model_type 'phimoe' via the transformers bridge" in str(plan)
    assert_same(model, reference, {"input_ids": torch.tensor([[1, 5, 9, 14, 2]])})


def test_a_partly_translated_family_loads_what_it_can_and_reports_the_rest(tmp_path):
    cls = T.DoryForCausalLM
    cfg = T.DoryConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                       n_input_layers=1, n_output_layers=1, n_recurrent_layers=2,
                       sliding_window=16)
    directory = save(cls, cfg, tmp_path)
    reference = cls.from_pretrained(directory, dtype=torch.float32).eval()
    with weightplan.init_empty():
        model = cls(cfg).eval()
    plan = weightplan.explain(model, directory)
    assert not plan.missing and not plan.unexpected
    (problem,) = plan.problems
    assert problem.kind.value == "mapping"
    assert "'dory'" in problem.message and "LayerPairCollapse" in problem.message
    assert "mapping: model_type 'dory' via the transformers bridge" in str(plan)
    plan.execute()
    assert_same(model, reference, {"input_ids": torch.tensor([[1, 5, 9, 14, 2]])})


@pytest.mark.parametrize("family", ["llava", "gemma3"])
def test_the_bridge_alone_agrees_with_the_built_in_mappings(family, tmp_path):
    """Translate transformers' mappings (no weightplan registry at all) for a composite."""
    cls, cfg, extra = vlm.FAMILIES[family]()
    directory = save(cls, cfg, tmp_path / "saved")
    legacy = rewrite(directory, tmp_path / "legacy",
                     lambda k: k.replace("vision_tower.", "vision_tower.vision_model.", 1))
    reference = cls.from_pretrained(directory, dtype=torch.float32).eval()
    with weightplan.init_empty():
        model = cls(cfg).eval()
    choice = lookup_mapping(model, MappingRegistry(), bridge=TransformersFinder())
    assert {s.path for s in choice.applied} == {"", "model", "model.vision_tower"}
    assert all(s.source is Source.TRANSFORMERS for s in choice.applied)
    plan = weightplan.explain(model, legacy, mapping=list(choice.transforms))
    assert not plan.missing and not plan.unexpected and not plan.problems, str(plan)
    plan.execute()
    assert_same(model, reference, vlm.inputs(extra))


def qwen3_vl_moe():
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}
    text = dict(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=8,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                num_experts=4, num_experts_per_tok=2, rope_parameters=rope)
    vision = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=4,
                  out_hidden_size=32, patch_size=8, spatial_merge_size=1,
                  temporal_patch_size=1, num_position_embeddings=16,
                  deepstack_visual_indexes=[0])
    return (T.Qwen3VLMoeForConditionalGeneration,
            T.Qwen3VLMoeConfig(text_config=text, vision_config=vision))


@pytest.mark.parametrize("layout", ["as_saved", "transposed"])
def test_fused_experts_in_either_layout_load_through_transpose_to_fit(layout, tmp_path):
    """transformers' Transpose(check_dims=True) (qwen3_vl_moe) as TransposeToFit."""
    cls, cfg = qwen3_vl_moe()
    directory = save(cls, cfg, tmp_path / "saved")
    if layout == "transposed":
        fused = ("experts.gate_up_proj", "experts.down_proj")
        directory = rewrite(directory, tmp_path / "transposed",
                            change=lambda k, v: v.transpose(1, 2) if k.endswith(fused) else v)
    model, reference, plan = load_both(cls, cfg, directory)
    swaps = {op.swap for c in plan.conversions for op in c.ops}
    assert swaps == {layout == "transposed"}
    assert_same(model, reference, {"input_ids": torch.tensor([[1, 5, 9, 14, 2]])})


def test_the_base_models_renamings_reach_the_heads_keys_as_in_transformers(tmp_path):
    """transformers scopes the mapping of the submodule at ``base_model_prefix`` with that
    prefix optional, so its renamings rename the head's keys too: ViTMAEForPreTraining's
    ``save_pretrained`` writes the decoder as ``decoder.decoder_encoder.layer.*`` (ViT's
    ``encoder.layer.`` → ``layers.`` run backwards) and loads it back. Was: 16 missing and
    16 unexpected, the decoder left at random init."""
    cfg = T.ViTMAEConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=48, image_size=16, patch_size=8, decoder_hidden_size=32,
                         decoder_num_hidden_layers=1, decoder_num_attention_heads=4,
                         decoder_intermediate_size=48)
    cls = T.ViTMAEForPreTraining
    directory = save(cls, cfg, tmp_path / "saved")
    from tests.interop.oracle import keys
    assert any(k.startswith("decoder.decoder_encoder.layer.0.") for k in keys(directory))
    model, reference, plan = load_both(cls, cfg, directory)
    expected, got = reference.state_dict(), model.state_dict()
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    weightplan.save(model, tmp_path / "again", progress=False)
    assert keys(tmp_path / "again") == keys(directory)
