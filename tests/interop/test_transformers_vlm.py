"""Composite (vision-language) families against transformers' from_pretrained: Llava,
Gemma3, PaliGemma and Mistral3 (a Llava-family model whose class and model_type differ
from Llava's). Each loads from the layout save_pretrained writes (the old flat
``language_model.model.*`` one), from the current layout (no transform may fire), and
from a legacy vision tower that still has its ``vision_model.`` level."""

import pytest
import torch

from tests.interop.oracle import assert_same, keys, load_both, rewrite, save

import transformers as T  # noqa: E402  (a dev dependency: always installed by `make test`)
from tests.interop.families import FAMILIES, INNER, inputs, llava  # noqa: E402


@pytest.mark.parametrize("family", FAMILIES)
def test_save_pretrained_layout_loads_like_from_pretrained(family, tmp_path):
    cls, cfg, extra = FAMILIES[family]()
    directory = save(cls, cfg, tmp_path)
    assert any(k.startswith("language_model.model.layers.") for k in keys(directory))
    model, reference, plan = load_both(cls, cfg, directory)
    applied = {s.path: s for s in plan.mapping.applied}
    assert (applied[""].identifier, applied[""].key) == (family, "llava")
    assert (applied["model"].identifier, applied["model"].key) == (INNER[family], "LlavaModel")
    assert applied["model"].transforms[0].scope_prefix == "model"
    text = str(plan)
    assert f"model ({INNER[family]}): class {INNER[family]}" in text
    assert "scoped to model.*" in text
    assert_same(model, reference, inputs(extra))


@pytest.mark.parametrize("family", FAMILIES)
def test_current_layout_loads_with_no_transform_firing(family, tmp_path):
    cls, cfg, extra = FAMILIES[family]()
    directory = save(cls, cfg, tmp_path, original_format=False)
    assert any(k.startswith("model.language_model.layers.") for k in keys(directory))
    model, reference, plan = load_both(cls, cfg, directory)
    assert all(not r.fired and r.converter is None and not r.note for r in plan.routing.routes)
    assert_same(model, reference, inputs(extra))


@pytest.mark.parametrize("family", ["llava", "gemma3", "paligemma"])
def test_legacy_vision_model_level_is_removed_in_scope(family, tmp_path):
    """Old checkpoints of CLIP / SigLIP towers keep ``vision_tower.vision_model.*``."""
    cls, cfg, extra = FAMILIES[family]()
    directory = save(cls, cfg, tmp_path / "saved")
    legacy = rewrite(directory, tmp_path / "legacy",
                     lambda k: k.replace("vision_tower.", "vision_tower.vision_model.", 1))
    assert any(k.startswith("vision_tower.vision_model.encoder.") for k in keys(legacy))
    model, reference, plan = load_both(cls, cfg, directory, legacy)
    tower = next(s for s in plan.mapping.applied if s.path == "model.vision_tower")
    assert tower.key == "CLIPVisionModel"
    assert tower.transforms[0].scope_prefix == "model.vision_tower"
    assert "remove prefix vision_model in model.vision_tower.*" in str(plan)
    assert_same(model, reference, inputs(extra))


def test_base_model_checkpoint_loads_into_the_composite(tmp_path):
    """A LlavaModel checkpoint (no ``model.`` level, no head) into LlavaForConditionalGeneration."""
    cls, cfg, extra = llava()
    directory = save(cls, cfg, tmp_path / "full", original_format=False)
    base = rewrite(directory, tmp_path / "base", lambda k: k.removeprefix("model."))
    assert any(k.startswith("language_model.layers.") for k in keys(base))
    model, reference, plan = load_both(cls, cfg, directory, base)
    assert_same(model, reference, inputs(extra))


def test_an_moe_text_model_inside_a_composite_gets_its_own_scoped_mapping(tmp_path):
    """Llava around a Mixtral: the root moves the text model, LlavaModel drops its
    ``model.`` level, then Mixtral's experts mapping converts under model.language_model."""
    from tests.interop.families import VISION

    text = T.MixtralConfig(vocab_size=96, hidden_size=32, intermediate_size=48,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           num_local_experts=4, num_experts_per_tok=2)
    cfg = T.LlavaConfig(text_config=text, image_token_index=95, vision_feature_layer=-1,
                        vision_config=T.CLIPVisionConfig(**VISION, projection_dim=32))
    cls = T.LlavaForConditionalGeneration
    directory = save(cls, cfg, tmp_path)
    assert "language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight" in keys(directory)
    model, reference, plan = load_both(cls, cfg, directory)
    moe = next(s for s in plan.mapping.applied if s.path == "model.language_model")
    assert (moe.identifier, moe.class_name) == ("mixtral", "MixtralModel")
    assert {t.scope_prefix for t in moe.transforms} == {"model.language_model"}
    assert "→ model.language_model.layers.{0,1}.mlp.experts.gate_up_proj" in str(plan)
    assert_same(model, reference, inputs({}))


@pytest.mark.parametrize("family", ["llava", "gemma3"])
def test_composite_save_gives_back_the_save_pretrained_checkpoint(family, tmp_path):
    """Load the flat layout save_pretrained writes, save with weightplan: same keys, same
    tensors (the scoped prefix moves run backwards from the load record)."""
    from safetensors.torch import load_file

    cls, cfg, extra = FAMILIES[family]()
    directory = save(cls, cfg, tmp_path / "saved")
    model, reference, plan = load_both(cls, cfg, directory)
    import weightplan
    weightplan.save(model, tmp_path / "again")
    original = load_file(str(directory / "model.safetensors"))
    written = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert set(written) == set(original)
    for key, value in original.items():
        assert written[key].dtype == value.dtype and torch.equal(written[key], value), key
