"""Packed checkpoints under tensor parallel (dequantized into a bf16 model): every rank's
local tensors equal weightplan's own non-TP load split as DTensor splits it, bit for bit;
each rank reads and decodes only the part its shard covers (test_quant_tp_slices.py: the
bytes read, EP, a boundary inside a group). Saving the dequantized model writes the oracle's
bf16 checkpoint."""

import pytest
import torch
from safetensors.torch import load_file

import weightplan
from tests.fp8.test_fp8_interop import meta_model
from tests.fp8.test_fp8_tp import check_rank
from tests.quant.checkpoints import quantized_checkpoint
from weightplan.parallel import TensorParallel
from weightplan.planner.tensors.verify.verify import verify

pytest.importorskip("compressed_tensors")


@pytest.mark.parametrize("kind, world", [("int", 2), ("nvfp4", 2), ("fp8-block", 3)])
def test_dequantized_ranks_equal_the_split_full_load(tmp_path, kind, world):
    qdir, _ = quantized_checkpoint(tmp_path, kind)
    model = meta_model("qwen3moe")
    weightplan.load(model, qdir, dtype=torch.bfloat16)
    full = {n: p.data for n, p in model.named_parameters()}
    for rank in range(world):  # FP8 blocks over 3 ranks: 86/85/85 rows, inside 64-blocks
        local = meta_model("qwen3moe")
        tp = TensorParallel(world_size=world, rank=rank, plan="auto", output="local")
        plan = weightplan.explain(local, qdir, dtype=torch.bfloat16, tp=tp)
        assert not plan.problems, str(plan)
        verify(plan.graph, plan.schedule.steps)
        plan.execute()
        check_rank(local, plan, full, world, rank)


def test_save_after_a_dequantized_load_writes_the_oracle(tmp_path):
    qdir, odir = quantized_checkpoint(tmp_path, "int-asym")
    model = meta_model("qwen3moe")
    weightplan.load(model, qdir, dtype=torch.bfloat16)
    weightplan.save(model, tmp_path / "saved")
    got = load_file(str(next((tmp_path / "saved").glob("*.safetensors"))))
    want = load_file(str(odir / "model.safetensors"))
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
