"""device_map placements of a model whose checkpoint holds a persistent buffer
(DeepSeek-V3's router ``e_score_correction_bias``). Built under ``init_empty()`` that buffer
is real (buffers stay real), as ``from_pretrained`` and the CLI build it: the placement was
refused ("already allocated"). It is loaded with its module: the model runs as the plain
load, saves back bit for bit, and ``weightplan explain --device-map auto`` explains it."""

import pytest
import torch
from safetensors.torch import load_file

import weightplan
from weightplan.cli import main

from tests.interop.matrix import FAMILIES, IDS

BIAS = "model.layers.1.mlp.gate.e_score_correction_bias"


@pytest.fixture(scope="module")
def dsv3(tmp_path_factory):
    cls, cfg, _ = FAMILIES["deepseek_v3"]()
    directory = tmp_path_factory.mktemp("dsv3")
    torch.manual_seed(0)
    model = cls(cfg)
    model.get_buffer(BIAS).normal_()  # (its init is zeros: a value the load must bring)
    model.save_pretrained(directory)
    return directory


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


SPLIT = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "cpu",
         "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}
PLACEMENTS = {"disk": dict(device_map="auto", max_memory={"cpu": "4KiB"}),  # all but buffers
              "parts": dict(device_map="auto", max_memory={"cpu": "60KiB"}),
              "cpu": dict(device_map="auto", max_memory={"cpu": "1GiB"}),
              "dict": dict(device_map=SPLIT)}  # its layer on the CPU, others on the disk


@pytest.mark.parametrize("how", list(PLACEMENTS))
def test_a_real_persistent_buffer_does_not_stop_the_placement(dsv3, tmp_path, how):
    plain = weightplan.from_pretrained(dsv3, progress=False)
    model = weightplan.from_pretrained(dsv3, **PLACEMENTS[how], offload_folder=tmp_path / "off",
                                       progress=False)
    assert torch.equal(model.get_buffer(BIAS), plain.get_buffer(BIAS))
    assert torch.equal(logits(model), logits(plain))
    weightplan.save(model, tmp_path / "saved")
    want, got = load_file(dsv3 / "model.safetensors"), load_file(tmp_path / "saved" / "model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_the_cli_explains_its_placement(dsv3, tmp_path, capsys):
    code = main(["explain", str(dsv3), "--device-map", "auto", "--max-memory", "cpu=60KiB",
                 "--offload-folder", str(tmp_path / "off")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "device map:" in out and "disk:" in out
