"""A quantized checkpoint placed with ``device_map="auto"`` under a CPU budget: the
dequantized tensors on their way to the disk are staged in host memory a read window at
a time (not all of them before the first is written), so what the load holds stays inside
the CPU's planned peak, as a bf16 checkpoint's does, and the offloaded model gives the
oracle's logits."""

import pytest
import torch

import weightplan
from tests.fp8.checkpoints import family
from tests.quant.checkpoints import quantized_checkpoint

pytest.importorskip("compressed_tensors")
pytest.importorskip("accelerate")


@pytest.mark.parametrize("kind", ["int", "nvfp4"])
def test_a_packed_checkpoint_offloaded_stays_inside_the_cpus_planned_peak(tmp_path, kind):
    qdir, odir = quantized_checkpoint(tmp_path, kind)
    cls, _ = family("qwen3moe")
    oracle = cls.from_pretrained(odir, dtype=torch.bfloat16).eval()
    budget = 3 * 2**20  # (the bf16 model: 2.76 MiB)
    with weightplan.init_empty():
        model = cls(oracle.config).eval()
    plan = weightplan.explain(model, qdir, dtype=torch.bfloat16, device_map="auto", threads=1,
                              max_memory={"cpu": budget}, offload_folder=tmp_path / "off")
    assert not plan.problems, str(plan)
    cpu = next(u for u in plan.options.placement.uses if u.device == "cpu")
    disk = next(u for u in plan.options.placement.uses if u.device == "disk")
    assert disk.weights and cpu.peak + cpu.kept <= budget
    assert plan.peak_bytes <= cpu.peak + cpu.kept, (plan.peak_bytes, cpu)
    report = plan.execute()
    assert report.peak_bytes <= plan.peak_bytes
    ids = torch.tensor([[1, 5, 9, 33, 2, 7, 100, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, oracle(ids).logits)
