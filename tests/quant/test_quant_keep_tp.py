"""Keep-quantized under tensor parallel: a model holding a packed checkpoint's stored
tensors, loaded with ``tp=``, gets on each rank exactly the slices of the single-process
keep-quantized load that its part of the logical weight needs: packed bytes and scales
split along the weight's split dim on whole quantization groups, per-tensor / global /
per-channel-under-a-row-split scales and ``weight_shape`` whole. A split that cuts a
group, an FP8 block or a packed word is refused at plan time (``ParallelError`` naming
the tensor and why). Real gloo ranks (torchrun) and, for odd world sizes, in process."""

from __future__ import annotations

import pytest
import torch

import weightplan
from tests.parallel.conftest import torchrun
from tests.quant.checkpoints import quantized_checkpoint
from tests.quant.keep_tp_worker import RULES, stored_model
from weightplan.errors import ParallelError
from weightplan.planner.core.sharding.placements import Placement
from weightplan.planner.core.sharding.shard_math import slice_local

pytest.importorskip("compressed_tensors")

WORKER = __import__("pathlib").Path(__file__).parent / "keep_tp_worker.py"
GLOO_KINDS = ("int-asym", "nvfp4", "fp8-channel", "modelopt")
COL = "model.layers.0.self_attn.q_proj."
ROW = "model.layers.0.self_attn.o_proj."
# the placement each rank's part must have (column split: `out`, row split: `in`)
EXPECTED = {
    "int-asym": {COL + "weight_packed": ("Shard", 0), COL + "weight_scale": ("Shard", 0),
                 COL + "weight_zero_point": ("Shard", 0), COL + "weight_shape": ("Replicate", None),
                 ROW + "weight_packed": ("Shard", 1), ROW + "weight_scale": ("Shard", 1),
                 ROW + "weight_zero_point": ("Shard", 1), ROW + "weight_shape": ("Replicate", None)},
    "nvfp4": {COL + "weight_packed": ("Shard", 0), COL + "weight_scale": ("Shard", 0),
              COL + "weight_global_scale": ("Replicate", None), ROW + "weight_packed": ("Shard", 1),
              ROW + "weight_scale": ("Shard", 1), ROW + "weight_global_scale": ("Replicate", None)},
    "fp8-channel": {COL + "weight": ("Shard", 0), COL + "weight_scale": ("Shard", 0),
                    ROW + "weight": ("Shard", 1), ROW + "weight_scale": ("Replicate", None)},
    "modelopt": {COL + "weight": ("Shard", 0), COL + "weight_scale": ("Shard", 0),
                 COL + "weight_scale_2": ("Replicate", None), ROW + "weight": ("Shard", 1),
                 ROW + "weight_scale": ("Shard", 1), ROW + "weight_scale_2": ("Replicate", None)},
}


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _single_process(qdir) -> dict[str, torch.Tensor]:
    model = stored_model(qdir)
    plan = weightplan.explain(model, qdir)
    assert "kept as stored" in str(plan).splitlines()[0], str(plan)
    plan.execute()
    return {n: p.data for n, p in model.named_parameters()}


def _placement(dumped: tuple | None) -> Placement:
    if dumped is None:
        return Placement.plain()
    (name, dim, factor), = dumped
    if name == "Shard":
        return Placement.shard(dim)
    return Placement.strided(dim, factor) if name == "_StridedShard" else Placement.replicate()


@pytest.fixture(scope="module")
def gloo_keep(tmp_path_factory):
    root = tmp_path_factory.mktemp("keep_tp")
    dirs = {k: quantized_checkpoint(root, k)[0] for k in GLOO_KINDS}
    out = root / "out"
    out.mkdir()
    torchrun(2, WORKER, str(out), *map(str, dirs.values()), timeout=300)
    return dirs, out


@pytest.mark.parametrize("kind", GLOO_KINDS)
def test_gloo_ranks_hold_the_slices_of_the_single_process_keep(gloo_keep, kind):
    dirs, out = gloo_keep
    full = _single_process(dirs[kind])
    sharded = set()
    for rank in range(2):
        ours = torch.load(out / f"{dirs[kind].name}.keep2.rank{rank}.pt")
        assert sorted(ours) == sorted(full)
        for name, (local, placements) in ours.items():
            want = slice_local(full[name], _placement(placements), 2, rank)
            assert local.dtype == full[name].dtype, name
            assert tuple(local.shape) == tuple(want.shape) and _bits(local) == _bits(want), \
                (name, rank, placements)
            if placements is not None and placements[0][0] == "Shard":
                sharded.add(name)
        for name, (kind_name, dim) in EXPECTED[kind].items():
            (got_name, got_dim, _), = ours[name][1]
            assert (got_name, got_dim) == (kind_name, dim), (name, ours[name][1])
    assert any(".experts." in n for n in sharded) and len(sharded) > 8, sharded


@pytest.mark.parametrize("kind", ["int", "fp8-channel", "nvfp4"])
def test_uneven_column_split_in_process(tmp_path, kind):
    """Three ranks split 256 and 128 rows unevenly (torch.chunk: 86/86/84, 43/43/42): exact for formats
    whose units along ``out`` are single rows."""
    qdir, _ = quantized_checkpoint(tmp_path, kind)
    full = _single_process(qdir)
    columns = {k: v for k, v in RULES.items() if v == "colwise"}
    for rank in range(3):
        model = stored_model(qdir)
        tp = weightplan.TensorParallel(world_size=3, rank=rank, plan=columns, output="local")
        plan = weightplan.explain(model, qdir, tp=tp)
        assert not plan.problems, str(plan)
        plan.execute()
        for name, p in model.named_parameters():
            want = slice_local(full[name], plan.sharding.plan.placement(name), 3, rank)
            assert _bits(p.data) == _bits(want) and p.shape == want.shape, (name, rank)
        assert model.get_parameter(COL + ("weight" if kind == "fp8-channel" else "weight_packed")
                                   ).shape[0] == (86, 86, 84)[rank]


@pytest.mark.parametrize("kind, rules, match", [
    ("int", RULES, r"down_proj.weight .*rank 0 of 3: the shard boundary at element 43 of "
                   r"`in` cuts a quantization group of 32"),
    ("nvfp4", RULES, r"down_proj.weight .*cuts a quantization group of 16"),
    ("int-asym", {k: v for k, v in RULES.items() if v == "colwise"},
     r"gate_proj.weight .*rank 0 of 3: its slice \[0, 43\) of dim 0 \(128\) is not whole "
     r"zero-point words \(8 rows per int32\): it widens to \[0, 48\)"),
    ("fp8-block", RULES, r"down_proj.weight .*not whole FP8 scale blocks \(64, 64\)"),
])
def test_a_split_inside_a_unit_is_refused_at_plan_time(tmp_path, kind, rules, match):
    qdir, _ = quantized_checkpoint(tmp_path, kind)
    tp = weightplan.TensorParallel(world_size=3, rank=1, plan=rules, output="local")
    with pytest.raises(ParallelError, match=match):
        weightplan.explain(stored_model(qdir), qdir, tp=tp)
