"""A dict ``device_map`` splitting a tie (a tied ``lm_head`` and its embedding) between the
disk and memory: refused at plan time naming both tensors (transformers 5.25's load with
the same map fails at the forward or at accelerate's dispatch); the pair on the disk together
loads and runs as transformers does."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import weightplan
from weightplan.errors import PlanError

IDS = torch.tensor([[1, 2, 3, 4]])
REST = {"model.layers": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu"}


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
    directory = tmp_path_factory.mktemp("tied")
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(directory)
    return cfg, directory


def _empty(cfg):
    with weightplan.init_empty():
        return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("disk,memory", [("lm_head", "model.embed_tokens"),
                                         ("model.embed_tokens", "lm_head")])
def test_a_tie_split_between_disk_and_memory_is_refused_at_plan_time(tied, tmp_path, disk, memory):
    cfg, directory = tied
    device_map = {**REST, disk: "disk", memory: "cpu"}
    said = (rf"device_map puts {disk}\.weight on 'disk' and {memory}\.weight, tied to it .*on 'cpu'"
            r".*map lm_head and model\.embed_tokens to the same device")
    for call in (lambda: weightplan.explain(_empty(cfg), directory, device_map=device_map,
                                            offload_folder=str(tmp_path / "off")),
                 lambda: weightplan.from_pretrained(directory, device_map=device_map,
                                                    offload_folder=str(tmp_path / "off2"))):
        with pytest.raises(PlanError, match=said):
            call()


def test_a_tie_on_the_disk_together_loads(tied, tmp_path):
    cfg, directory = tied
    device_map = {**REST, "lm_head": "disk", "model.embed_tokens": "disk"}
    expected = LlamaForCausalLM.from_pretrained(directory, device_map=device_map,
                                                offload_folder=str(tmp_path / "tf"))(IDS).logits
    model = _empty(cfg)
    weightplan.load(model, directory, device_map=device_map, offload_folder=str(tmp_path / "wp"))
    torch.testing.assert_close(model(IDS).logits, expected)
