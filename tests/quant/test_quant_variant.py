"""A packed checkpoint's weight variant: ``explain(model, DIR, variant=...)`` reads the
directory's config.json with the variant's files (its ``quantization_config`` tells the
packed format), as the same directory's plain files are read."""

import shutil

import pytest
import torch

import weightplan
from tests.fp8.test_fp8_interop import meta_model
from tests.quant.checkpoints import quantized_checkpoint

pytest.importorskip("compressed_tensors")


def test_a_variant_of_a_packed_checkpoint_is_read_with_its_config(tmp_path):
    """Was (explain's variant read with no config): the packed weights unexpected keys."""
    qdir, _ = quantized_checkpoint(tmp_path / "q", "int", True)
    variant = tmp_path / "variant"
    shutil.copytree(qdir, variant)
    (variant / "model.safetensors").rename(variant / "model.int4.safetensors")
    plain = weightplan.explain(meta_model("qwen3moe"), qdir, dtype=torch.bfloat16)
    plan = weightplan.explain(meta_model("qwen3moe"), variant, dtype=torch.bfloat16,
                              variant="int4")
    assert not plan.problems and not plan.missing and not plan.unexpected, str(plan)
    assert str(plan).count("INT4 pack-quantized (group 32, symmetric)") == 1
    assert plan.peak_bytes == plain.peak_bytes and plan.loaded_keys == plain.loaded_keys
