"""A plain load imports only what it runs: nothing of saving, converting, resolving a
tensor-parallel plan, the transformers bridge, the pictures or the progress bar (each is
imported where it is used), and no module of a feature its input doesn't have (quantized
formats, adapters, tensor parallelism, strided or cooperative reads, device maps: each
phase runs behind one visible test of the input, its modules imported only then), so a
user's first load doesn't pay for them. Probed in a fresh process, as the import cost is
paid once per process."""

import json
import subprocess
import sys

# what only a save / a conversion, a tensor-parallel plan, a transformers model or a
# mapping given by name, or a drawing needs; rich, for a progress bar
NOT_FOR_A_PLAIN_LOAD = (
    "weightplan.api.convert", "weightplan.api.model_config", "weightplan.api.pretrained",
    "weightplan.api.write_plans", "weightplan.planner.pipelines.save",
    "weightplan.planner.pipelines.write_plan", "weightplan.planner.write.shards",
    "weightplan.executor.execute_write", "weightplan.executor.writer",
    "weightplan.planner.inputs.parallel_plan", "weightplan.planner.core.sharding.styles",
    "weightplan.bridge", "weightplan.bridge.transformers", "weightplan.bridge.names",
    "weightplan.viz.dot", "weightplan.viz.boxes", "rich",
    # features the input doesn't have: quantized formats (FP8, packed), adapters, tensor
    # parallelism, strided and cooperative reads, device maps; and ops no mapping named
    "weightplan.planner.inputs.quant_config", "weightplan.planner.inputs.quant_formats",
    "weightplan.planner.inputs.fp8_pairs", "weightplan.planner.inputs.fp8_model",
    "weightplan.planner.inputs.packed_pairs", "weightplan.planner.core.quant.formats",
    "weightplan.planner.inputs.packed_routing", "weightplan.planner.inputs.packed_problems",
    "weightplan.planner.inputs.small_reads",
    "weightplan.planner.core.quant.kinds", "weightplan.planner.core.quant.quantize",
    "weightplan.planner.tensors.ir.quant_build", "weightplan.planner.tensors.ir.packed_build",
    "weightplan.planner.tensors.ir.quant_scales", "weightplan.planner.tensors.lower.quant_steps",
    "weightplan.planner.pipelines.fp8_findings", "weightplan.planner.pipelines.packed_findings",
    "weightplan.executor.dequant", "weightplan.executor.packed",
    "weightplan.planner.inputs.adapter", "weightplan.planner.pipelines.adapter_load",
    "weightplan.planner.core.sharding.config", "weightplan.planner.tensors.ir.shard_nodes",
    "weightplan.executor.dtensors", "weightplan.executor.strided_read",
    "weightplan.planner.tensors.verify.strided_checks", "weightplan.api.keywords",
    "weightplan.planner.pipelines.cooperative", "weightplan.executor.exchange",
    "weightplan.planner.pipelines.devices", "weightplan.planner.tensors.schedule.device_plan",
    "weightplan.planner.core.ops.reshape", "weightplan.planner.core.ops.layout",
    "weightplan.planner.core.ops.blocks",
    # a sharded or strided read's geometry, an adapter's merge ops, CUDA staging buffers
    "weightplan.planner.core.sharding.placements", "weightplan.planner.core.sharding.shard_math",
    "weightplan.planner.tensors.lower.strided", "weightplan.planner.core.ops.merge",
    "weightplan.executor.staging",
)
# the load, then what a save and a tensor-parallel plan of the same model import (the
# probe's control: the modules above exist and it sees them come in)
PROBE = """
import json, sys
import torch
from safetensors.torch import save_file
from torch import nn

import weightplan

def seen():
    return sorted(m for m in sys.modules if m.startswith("weightplan") or m == "rich")

directory, out = sys.argv[1], sys.argv[2]
source = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
save_file({k: v.contiguous() for k, v in source.state_dict().items()}, directory + "/model.safetensors")
with weightplan.init_empty():
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
plan = weightplan.explain(model, directory)
text = str(plan)
plan.execute()
assert torch.equal(model[0].weight, source[0].weight), "not loaded"
load = seen()
weightplan.save(model, out, progress=True)
tp = weightplan.TensorParallel({"0": "colwise"}, world_size=2, rank=0, output="local")
with weightplan.init_empty():
    weightplan.explain(nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)), directory, tp=tp)
print(json.dumps({"load": load, "after": seen()}))
"""


def test_a_plain_load_imports_no_saving_parallel_or_fp8_module(tmp_path):
    (tmp_path / "out").mkdir()
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path), str(tmp_path / "out")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert "weightplan.executor.execute_load" in seen["load"]  # (it did load)
    assert sorted(set(NOT_FOR_A_PLAIN_LOAD) & set(seen["load"])) == []
    # the control: a save imports the write side and a tp= plan the sharding modules
    control = {m for m in NOT_FOR_A_PLAIN_LOAD
               if m.startswith(("weightplan.api.write", "weightplan.planner.pipelines.save",
                                "weightplan.executor.execute_write",
                                "weightplan.planner.inputs.parallel_plan", "rich",
                                "weightplan.planner.core.sharding.config",
                                "weightplan.planner.tensors.ir.shard_nodes"))}
    assert control <= set(seen["after"])
