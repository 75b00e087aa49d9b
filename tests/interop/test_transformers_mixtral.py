"""transformers as the oracle: a MixtralForCausalLM saved by save_pretrained (legacy
per-expert layout) loads through weightplan exactly as from_pretrained loads it."""

import pytest
import torch
from safetensors import safe_open
from transformers import MixtralConfig, MixtralForCausalLM

import weightplan


def tiny_config(tied: bool) -> MixtralConfig:
    return MixtralConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                         num_experts_per_tok=2, tie_word_embeddings=tied)


@pytest.fixture(params=[False, True], ids=["untied", "tied"])
def saved(request, tmp_path):
    torch.manual_seed(0)
    cfg = tiny_config(request.param)
    MixtralForCausalLM(cfg).save_pretrained(tmp_path)
    return cfg, tmp_path


def test_save_pretrained_writes_the_legacy_layout(saved):
    _, directory = saved
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.layers.0.block_sparse_moe.experts.3.w1.weight" in keys
    assert not any("gate_up_proj" in k for k in keys)


def test_load_matches_from_pretrained(saved):
    cfg, directory = saved
    reference = MixtralForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with weightplan.init_empty():
        model = MixtralForCausalLM(cfg).eval()
    assert all(p.is_meta for p in model.parameters())
    plan = weightplan.explain(model, directory)
    assert plan.mapping.key == "mixtral"
    assert not plan.missing and not plan.unexpected and not plan.mismatched
    plan.execute()
    expected = reference.state_dict()
    got = model.state_dict()
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    ids = torch.tensor([[1, 5, 9, 14, 2, 7]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)


def test_fully_meta_model_gets_its_buffers_rebuilt_by_its_own_init(saved):
    cfg, directory = saved
    with torch.device("meta"):
        model = MixtralForCausalLM(cfg)
    plan = weightplan.explain(model, directory)
    assert not plan.problems, str(plan)
    assert any("inv_freq" in n.key and "rebuilds it" in n.message for n in plan.notes)
    plan.execute()
    with weightplan.init_empty():
        expected = MixtralForCausalLM(cfg)
    assert not model.model.rotary_emb.inv_freq.is_meta
    assert torch.equal(model.model.rotary_emb.inv_freq, expected.model.rotary_emb.inv_freq)


def test_save_gives_back_what_save_pretrained_wrote(saved, tmp_path):
    cfg, directory = saved
    with weightplan.init_empty():
        model = MixtralForCausalLM(cfg)
    weightplan.load(model, directory)
    out = tmp_path / "weightplan-out"
    weightplan.save(model, out, max_shard_size="100KB")
    cfg.save_pretrained(out)
    original = {}
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        for key in f.keys():
            original[key] = f.get_tensor(key)
    written = {}
    for shard in sorted(out.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for key in f.keys():
                written[key] = f.get_tensor(key)
    assert set(written) == set(original)
    for key, value in original.items():
        assert written[key].dtype == value.dtype and torch.equal(written[key], value), key
    reloaded = MixtralForCausalLM.from_pretrained(out, dtype=torch.float32)
    reference = MixtralForCausalLM.from_pretrained(directory, dtype=torch.float32)
    expected = reference.state_dict()
    for key, value in reloaded.state_dict().items():
        assert torch.equal(value, expected[key]), key
