"""``weightplan.save`` writes the keys ``save_pretrained`` writes, for models that declare
keys not to save (``_keys_to_ignore_on_save``)."""

import pytest
import torch
import transformers as T
from safetensors.torch import load_file

import weightplan

from tests.interop.matrix import pretrained
from tests.interop.oracle import keys, rewrite

MARIAN = T.MarianConfig(vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                        decoder_ffn_dim=48, max_position_embeddings=32, decoder_start_token_id=0,
                        pad_token_id=0)
POSITIONS = {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}


@pytest.mark.parametrize("stored", [False, True], ids=["as-saved", "old-with-positions"])
def test_keys_the_model_declares_unsaved_are_not_written(stored, tmp_path):
    """Was: a MarianMTModel loaded and saved wrote its sinusoidal ``embed_positions``
    (listed in ``_keys_to_ignore_on_save``), which ``save_pretrained`` leaves out; an old
    checkpoint storing them (loaded: transformers ignores them as unexpected) kept them."""
    torch.manual_seed(0)
    T.MarianMTModel(MARIAN).save_pretrained(tmp_path / "saved")
    directory = tmp_path / "saved"
    if stored:
        state = T.MarianMTModel.from_pretrained(directory).state_dict()
        directory = rewrite(directory, tmp_path / "old")
        from safetensors.torch import save_file
        tensors = load_file(str(directory / "model.safetensors"))
        save_file({**tensors, **{k: state[k].contiguous() for k in POSITIONS}},
                  str(directory / "model.safetensors"), metadata={"format": "pt"})
        assert POSITIONS <= keys(directory)
    theirs = pretrained(T.MarianMTModel, directory, dtype=torch.float32)
    theirs.save_pretrained(tmp_path / "theirs")
    model = weightplan.from_pretrained(directory, dtype=torch.float32, progress=False)
    weightplan.save(model, tmp_path / "mine", progress=False)
    assert not POSITIONS & keys(tmp_path / "theirs")
    assert keys(tmp_path / "mine") == keys(tmp_path / "theirs")
    back = pretrained(T.MarianMTModel, tmp_path / "mine", dtype=torch.float32)
    for key, value in theirs.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


LLAMA = T.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
MIXTRAL = T.MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                          num_local_experts=3, num_experts_per_tok=2, tie_word_embeddings=False)
HEADS = [(T.LlamaForCausalLM, T.LlamaModel, LLAMA), (T.LlamaModel, T.LlamaForCausalLM, LLAMA),
         (T.MixtralForCausalLM, T.MixtralModel, MIXTRAL),
         (T.MixtralModel, T.MixtralForCausalLM, MIXTRAL)]


@pytest.mark.parametrize("stored, loaded, cfg", HEADS,
                         ids=lambda x: getattr(x, "__name__", ""))
def test_a_model_loaded_under_another_head_class_saves_its_own_keys(stored, loaded, cfg,
                                                                     tmp_path):
    """Was: a LlamaForCausalLM checkpoint loaded into LlamaModel saved ``model.layers...``
    (the checkpoint's base-model prefix), a LlamaModel checkpoint loaded into
    LlamaForCausalLM saved ``layers...`` beside its ``lm_head.weight``, which transformers
    then read as a model with no base weights; save_pretrained writes the loaded class's
    own keys (the prefix fix-up is the load's, not the checkpoint's layout)."""
    torch.manual_seed(0)
    stored(cfg).save_pretrained(tmp_path / "saved")
    theirs = pretrained(loaded, tmp_path / "saved", dtype=torch.float32)
    theirs.save_pretrained(tmp_path / "theirs")
    model = weightplan.from_pretrained(tmp_path / "saved", model_class=loaded,
                                       dtype=torch.float32, progress=False)
    weightplan.save(model, tmp_path / "mine", progress=False)
    assert keys(tmp_path / "mine") == keys(tmp_path / "theirs")
    back = pretrained(loaded, tmp_path / "mine", dtype=torch.float32)
    for key, value in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key
    again = weightplan.from_pretrained(tmp_path / "mine", progress=False)
    weightplan.save(again, tmp_path / "again", progress=False)
    assert keys(tmp_path / "again") == keys(tmp_path / "theirs")
