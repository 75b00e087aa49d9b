"""Old key layouts transformers 5.25 still converts on every load (its ``legacy`` mapping),
written by renaming the keys of a checkpoint ``save_pretrained`` wrote: weightplan loads
the tensors transformers loads, and saves them back in the layout they came in, as
``save_pretrained`` does after such a load."""

import pytest
import torch
import transformers as T
from safetensors.torch import load_file

import weightplan

from tests.interop.families import TEXT
from tests.interop.matrix import pretrained
from tests.interop.oracle import keys, rewrite, save


def _same_as_transformers(cls, directory, inputs=None):
    theirs = pretrained(cls, directory, dtype=torch.float32)
    model, info = weightplan.from_pretrained(directory, dtype=torch.float32, progress=False,
                                             output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    expected, got = theirs.state_dict(), model.state_dict()
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
    if inputs is not None:
        with torch.no_grad():
            assert torch.equal(model(**inputs).logits, theirs(**inputs).logits)
    return model, theirs


def _wav2vec2():
    return T.Wav2Vec2ForCTC, T.Wav2Vec2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, conv_dim=(8, 8), conv_stride=(4, 4), conv_kernel=(8, 4),
        num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2)


def test_weight_norm_weight_g_and_weight_v_load_into_the_parametrization(tmp_path):
    """Was: ``pos_conv_embed.conv.weight_g`` / ``weight_v`` (torch's old ``weight_norm``,
    every Wav2Vec2/HuBERT checkpoint on the Hub) were unexpected and the parametrization's
    ``original0`` / ``original1`` missing, initialized at random; transformers renames them."""
    cls, cfg = _wav2vec2()
    directory = save(cls, cfg, tmp_path / "saved")
    legacy = rewrite(directory, tmp_path / "legacy", lambda k: k.replace(
        ".parametrizations.weight.original0", ".weight_g").replace(
        ".parametrizations.weight.original1", ".weight_v"))
    assert "wav2vec2.encoder.pos_conv_embed.conv.weight_g" in keys(legacy)
    plan = weightplan.explain(_empty(cls, cfg), legacy)
    assert not plan.problems, str(plan)
    torch.manual_seed(1)
    model, theirs = _same_as_transformers(cls, legacy, {"input_values": torch.randn(1, 64)})
    weightplan.save(model, tmp_path / "again", progress=False)
    theirs.save_pretrained(tmp_path / "theirs")
    assert keys(tmp_path / "again") == keys(tmp_path / "theirs") == keys(legacy)


def _empty(cls, cfg):
    with weightplan.init_empty():
        return cls(cfg).eval()


def _qwen2_audio():
    return T.Qwen2AudioForConditionalGeneration, T.Qwen2AudioConfig(
        text_config=dict(model_type="qwen2", **TEXT),
        audio_config=dict(d_model=32, encoder_layers=2, encoder_attention_heads=4,
                          encoder_ffn_dim=48, num_mel_bins=8, max_source_positions=8))


def _qwen2_vl():
    return T.Qwen2VLForConditionalGeneration, T.Qwen2VLConfig(
        text_config=dict(**TEXT, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2,
                           patch_size=4, spatial_merge_size=2, temporal_patch_size=2))


@pytest.mark.parametrize("build, original, old, new", [
    (_qwen2_audio, True, "language_model.model.", "language_model.model.model."),
    (_qwen2_vl, False, "model.language_model.", "model.language_model.model."),
], ids=["qwen2_audio-flat", "qwen2_vl-current"])
def test_the_doubled_model_level_of_v5_10_to_v5_23_saves_is_removed(build, original, old, new,
                                                                     tmp_path):
    """Was: checkpoints saved by transformers 5.10-5.23 with a doubled ``.model.model``
    under the language model (transformers #45534) loaded every text weight as unexpected,
    the text model left at random init with a warning; transformers renames them back."""
    cls, cfg = build()
    directory = save(cls, cfg, tmp_path / "saved", original_format=original)
    doubled = rewrite(directory, tmp_path / "doubled",
                      lambda k: new + k.removeprefix(old) if k.startswith(old) else k)
    assert any(k.startswith(new + "layers.") for k in keys(doubled))
    plan = weightplan.explain(_empty(cls, cfg), doubled)
    assert not plan.problems, str(plan)
    ids = {"input_ids": torch.tensor([[1, 5, 9, 14, 2]])}
    model, theirs = _same_as_transformers(cls, doubled, ids)
    weightplan.save(model, tmp_path / "again", progress=False)
    written = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert set(written) == keys(doubled)  # the layout it came in, as save_pretrained keeps it
