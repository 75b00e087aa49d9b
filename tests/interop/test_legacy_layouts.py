"""Old key layouts transformers 5.25 still converts on every load (its ``legacy`` mapping),
written by renaming the keys of a checkpoint ``save_pretrained`` wrote: weightplan loads
the tensors transformers loads, and saves them back in the layout they came in, as
``save_pretrained`` does after such a load."""

import torch
import transformers as T

import weightplan

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
