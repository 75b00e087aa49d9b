"""Shard math against DTensor's own split, styles, the TensorParallel config, FP8 slices."""

import pytest
import torch
from torch.distributed.tensor.placement_types import Shard, _StridedShard

from weightplan.errors import ParallelError
from weightplan.parallel import TensorParallel, as_tensor_parallel
from weightplan.planner.core.geometry import Region
from weightplan.planner.core.sharding import styles
from weightplan.planner.core.sharding.fp8_slices import (
    box_bytes, covering_blocks, dequantize_box, scale_shape,
)
from weightplan.planner.core.sharding.placements import Placement
from weightplan.planner.core.sharding.shard_math import (
    chunk_bounds, local_fragments, local_shape, slice_local,
)

PLACEMENTS = [(Placement.shard(1), Shard(1)),
              (Placement.strided(1, 2), _StridedShard(1, split_factor=2)),
              (Placement.strided(-1, 3), _StridedShard(1, split_factor=3))]


@pytest.mark.parametrize("ours, theirs", PLACEMENTS)
def test_local_slices_equal_dtensor_split_for_every_size(ours, theirs):
    for size in range(1, 24):
        full = torch.arange(3 * size).reshape(3, size)
        for world in (1, 2, 3, 4, 5, 8):
            shards, _ = theirs._split_tensor(full, world, with_padding=False)
            for rank in range(world):
                mine = slice_local(full, ours, world, rank)
                assert torch.equal(mine, shards[rank]), (size, world, rank)
                assert local_shape(ours, (3, size), world, rank) == tuple(mine.shape)


def test_uneven_chunks_leave_trailing_ranks_short_or_empty():
    assert [chunk_bounds(102, 4, r) for r in range(4)] == [(0, 26), (26, 52), (52, 78), (78, 102)]
    assert [chunk_bounds(5, 4, r) for r in range(4)] == [(0, 2), (2, 4), (4, 5), (5, 5)]
    assert local_fragments(Placement.shard(0), (5, 2), 4, 3) == ()


def test_packed_fragments_take_a_slice_of_each_half():
    frags = local_fragments(Placement.strided(1, 2), (4, 96, 64), 2, 1, target=7)
    assert [(f.region.starts[1], f.region.stops[1]) for f in frags] == [(24, 48), (72, 96)]
    assert [f.view.offset for f in frags] == [0, 24 * 64]
    assert all(f.target == 7 and f.view.shape == (4, 24, 64) for f in frags)


@pytest.mark.parametrize("style, name, ndim, expected", [
    ("colwise", "weight", 2, Placement.shard(0)), ("colwise", "bias", 1, Placement.shard(0)),
    ("rowwise", "weight", 2, Placement.shard(1)), ("rowwise", "down_proj", 3, Placement.shard(2)),
    ("rowwise", "bias", 1, Placement.replicate()),
    ("packed_colwise", "gate_up_proj", 3, Placement.strided(1, 2)),
    ("packed_rowwise", "weight", 2, Placement.strided(1, 2)),
    ("packed_rowwise", "bias", 1, Placement.replicate()),
    ("embedding_rowwise", "weight", 2, Placement.shard(0)),
    ("grouped_gemm", "gate_up_proj", 3, Placement.shard(0)),
    ("colwise_gather_output", "weight", 2, Placement.shard(0)),
    ("sequence_parallel", "weight", 1, Placement.replicate()),
    ("replicated_with_grad_allreduce", "weight", 1, Placement.plain()),
    ("replicate", "weight", 2, Placement.plain()),
    ("moe_tp_experts", "gate_up_proj", 3, Placement.plain()),
    ("ep_dispatch_experts", "down_proj", 3, Placement.plain()),
])
def test_style_catalogue(style, name, ndim, expected):
    assert styles.known(style)
    assert styles.placement_for(style, f"m.x.{name}", ndim) == expected


def test_placements_round_trip_through_torch():
    for ours, _ in PLACEMENTS[:2] + [(Placement.replicate(), None)]:
        back = Placement.from_torch(ours.to_torch())
        assert back == ours
    assert Placement.plain().to_torch() is None
    assert str(Placement.strided(1, 2)) == "_StridedShard(dim=1, sf=2)"


@pytest.mark.parametrize("kwargs, words", [
    (dict(experts="expert"), "experts='expert'"), (dict(output="full"), "output='full'"),
    (dict(world_size=4), "together"), (dict(world_size=4, rank=4), "0 <= rank"),
    (dict(world_size=0, rank=0), "world_size >= 1"), (dict(plan=["colwise"]), "plan="),
    (dict(plan={"x": 1}), "plan="), (dict(mesh=object()), "1-D DeviceMesh"),
])
def test_config_errors_name_the_argument_and_fix(kwargs, words):
    with pytest.raises(ParallelError, match=words.replace("(", r"\(")):
        TensorParallel(**kwargs)


def test_config_dry_run_and_auto():
    tp = TensorParallel(world_size=8, rank=3, plan={"a.*": "colwise"}, output="local")
    assert tp.ranks().dry_run and (tp.ranks().world_size, tp.ranks().rank) == (8, 3)
    assert hash(tp) == hash(TensorParallel(world_size=8, rank=3, plan={"a.*": "colwise"},
                                           output="local"))
    assert as_tensor_parallel("auto") == TensorParallel()
    with pytest.raises(ParallelError, match="'auto'"):
        as_tensor_parallel("yes")
    with pytest.raises(ParallelError, match="process group"):
        TensorParallel().ranks()


def ref_dequant(q, s, block=(128, 128)):
    rows, cols = q.shape
    e = s.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return (q.float() * e).to(torch.bfloat16)


@pytest.mark.parametrize("rows, world", [(192, 2), (320, 3), (128, 2), (576, 8), (5, 8)])
def test_fp8_shards_dequantize_exactly_when_not_multiples_of_128(rows, world):
    torch.manual_seed(0)
    cols = 200
    q = (torch.randn(rows, cols) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(scale_shape((rows, cols))) + 0.5
    full = ref_dequant(q, s)
    for rank in range(world):
        lo, hi = chunk_bounds(rows, world, rank)
        box = Region((lo, 0), (hi, cols))
        tiles = covering_blocks(box)
        part = s[tiles.starts[0]:tiles.stops[0], tiles.starts[1]:tiles.stops[1]]
        got = dequantize_box(q[lo:hi], part, box, torch.bfloat16)
        assert torch.equal(got, full[lo:hi]), (rank, lo, hi)
        assert box_bytes(box) == (hi - lo) * cols + tiles.numel * 4


def test_fp8_scale_tiles_of_a_column_box():
    box = Region((64, 100), (128, 300))  # rows inside tile 0, cols across tiles 0..2
    assert covering_blocks(box) == Region((0, 0), (1, 3))
    assert covering_blocks(Region((128, 0), (128, 5))).numel == 0


def test_only_a_plan_the_user_wrote_is_checked_for_entries_matching_nothing():
    """A model's own tp_plan may name layers it lacks (dense MLPs of an all-MoE model), as
    transformers' plans do; the same entry in a plan the user wrote is a problem."""
    from torch import nn

    from weightplan.planner.core.sharding.config import TensorParallel
    from weightplan.planner.inputs.parallel_plan import resolve_sharding

    class Tiny(nn.Module):
        tp_plan = {"proj": "colwise", "layers.*.mlp.gate_proj": "colwise"}

        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 8)

    auto = resolve_sharding(Tiny(), TensorParallel(world_size=2, rank=0, output="local"), 2)
    assert not auto.issues and auto.placement("proj.weight").is_dtensor
    given = resolve_sharding(Tiny(), TensorParallel(plan=dict(Tiny.tp_plan), world_size=2,
                                                    rank=0, output="local"), 2)
    assert [i.key for i in given.issues] == ["layers.*.mlp.gate_proj"]
