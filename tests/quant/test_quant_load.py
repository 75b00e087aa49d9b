"""Loads of quantized checkpoints into a floating model: every parameter equal to a plain
load of the oracle's dequantized weights (per expert, before the merges), the plan's note
naming each format, its memory estimate against what the executor held."""

import pytest
import torch

import weightplan
from tests.fp8.test_fp8_interop import meta_model, same
from tests.quant.checkpoints import quantized_checkpoint

pytest.importorskip("compressed_tensors")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("quant")


def _load(directory):
    model = meta_model("qwen3moe")
    plan = weightplan.explain(model, directory, dtype=torch.bfloat16)
    assert not plan.problems and not plan.missing and not plan.unexpected, str(plan)
    plan.execute()
    return model, plan


@pytest.mark.parametrize("kind,experts_only,phrase", [
    ("int", True, "INT4 pack-quantized (group 32, symmetric)"),
    ("int-asym", False, "INT4 pack-quantized (group 32, asymmetric, zero points)"),
    ("fp8-channel", False, "FP8 compressed-tensors (per channel scales)"),
    ("fp8-tensor", False, "FP8 compressed-tensors (per tensor scales)"),
    ("fp8-block", False, "FP8 compressed-tensors (block 64×64 scales)"),
    ("nvfp4", False, "NVFP4 compressed-tensors (E2M1, 16 per F8 scale, ÷ weight_global_scale)"),
    ("modelopt", False, "NVFP4 ModelOpt (E2M1, 16 per F8 scale, · weight_scale_2)"),
])
def test_load_equals_oracle(root, kind, experts_only, phrase):
    qdir, odir = quantized_checkpoint(root, kind, experts_only)
    got, plan = _load(qdir)
    want, _ = _load(odir)
    text = str(plan)
    assert text.count(phrase) == 1, text
    wanted = dict(want.named_parameters())
    for name, p in got.named_parameters():
        assert same(p.detach(), wanted[name].detach()), name
    assert any(".experts." in n for n, _ in got.named_parameters())


@pytest.mark.parametrize("kind", ["int", "modelopt"])
def test_from_pretrained_of_the_file_reads_the_config_beside_it(root, kind):
    """``from_pretrained(dir/model.safetensors)`` loads what ``from_pretrained(dir)`` loads:
    the packed format is told by the config.json (or hf_quant_config.json) beside the file.
    Was: that config was looked for under the file's own path, so the packed weights were
    unexpected keys and their parameters left to the model's init (int) or refused as
    mismatched (modelopt)."""
    qdir, _ = quantized_checkpoint(root, kind)
    want = dict(weightplan.from_pretrained(qdir, progress=False).named_parameters())
    got = weightplan.from_pretrained(qdir / "model.safetensors", progress=False, strict=True)
    for name, p in got.named_parameters():
        assert same(p.detach(), want[name].detach()), name
