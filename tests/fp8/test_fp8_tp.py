"""FP8 checkpoints under tensor parallel: each rank reads its fp8 slice and its scale tiles.

A dequantize load (bf16 model) under ``tp=`` pushes each rank's shard through the
DEQUANTIZE node: every rank's local tensors equal weightplan's own non-TP dequantize load
split as DTensor splits it, bit for bit, including shards that are not multiples of 128
(64-row k/v shards, DeepSeek-V3's 192-row ``kv_a_proj_with_mqa`` as 96 + 96, 320 rows over
3 ranks). A keep-FP8 load shards weight and scale alike where the split follows the
128-blocks, and is a problem on every rank where it doesn't.
"""

import pytest
import torch

import weightplan
from tests.fp8.test_fp8_interop import meta_model
from weightplan.errors import QuantizationError
from weightplan.parallel import TensorParallel
from weightplan.planner.pipelines.ranks import read_bytes
from weightplan.planner.core.sharding.shard_math import slice_local
from weightplan.planner.tensors.verify.verify import verify

MLA = {"model.layers.*.self_attn.kv_a_proj_with_mqa": "colwise",  # 192 (or 320) rows
       "model.layers.*.self_attn.q_b_proj": "colwise",
       "model.layers.*.mlp.experts.gate_up_proj": "packed_colwise",
       "model.layers.*.mlp.experts.down_proj": "rowwise"}
CASES = [("llama", "auto", 2), ("mixtral", "auto", 2), ("dsv3", "auto", 2), ("dsv3", MLA, 2),
         ("dsv3x", MLA, 3)]
_FULL: dict = {}


def full_load(fp8_checkpoints, name, fp8=False):
    """weightplan's own non-TP load (dequantized to bf16, or kept FP8): the reference."""
    if (name, fp8) not in _FULL:
        model = meta_model(name, fp8=fp8)
        plan = weightplan.explain(model, fp8_checkpoints(name)[1], dtype=torch.bfloat16)
        assert not plan.problems, str(plan)
        plan.execute()
        _FULL[name, fp8] = {n: p.data for n, p in model.named_parameters()}
    return _FULL[name, fp8]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype.itemsize == 1 else t


def rank_load(fp8_checkpoints, name, plan, world, rank, fp8=False):
    model = meta_model(name, fp8=fp8)
    tp = TensorParallel(world_size=world, rank=rank, plan=plan, output="local")
    return model, weightplan.explain(model, fp8_checkpoints(name)[1], dtype=torch.bfloat16, tp=tp)


def check_rank(model, plan, full, world, rank) -> int:
    """Asserts the rank's tensors are the reference's DTensor split; returns its bytes."""
    local_bytes = sharded = 0
    for name, param in model.named_parameters():
        placement = plan.sharding.plan.placement(name)
        want = slice_local(full[name], placement.normalized(full[name].dim()), world, rank)
        assert param.dtype == want.dtype and param.shape == want.shape, name
        assert torch.equal(bits(param.data), bits(want)), name
        local_bytes += want.numel() * want.element_size()
        sharded += placement.is_sharded
    assert sharded
    return local_bytes


@pytest.mark.parametrize("name, plan, world", CASES)
def test_dequantized_ranks_equal_the_split_full_load(fp8_checkpoints, name, plan, world):
    full = full_load(fp8_checkpoints, name)
    for rank in range(world):
        model, p = rank_load(fp8_checkpoints, name, plan, world, rank)
        assert not p.problems, str(p)
        verify(p.graph, p.schedule.steps)
        report = p.execute()
        local = check_rank(model, p, full, world, rank)
        reads = [r for s in p.schedule.steps for r in s.reads]
        tiles = sum(r.scale_bytes for r in reads)
        assert report.bytes_needed == read_bytes(p)
        assert report.bytes_needed - tiles <= 1.02 * local
        # each scale read is exactly the tiles covering its fp8 box (not the whole grid)
        for r in reads:
            if r.dequantize is not None:
                b0, b1 = r.dequantize.block
                (r0, c0), (r1, c1) = r.region.starts[-2:], r.region.stops[-2:]
                assert r.scale_region.starts[-2:] == (r0 // b0, c0 // b1)
                assert r.scale_region.stops[-2:] == (-(-r1 // b0), -(-c1 // b1))


def scale_rows(plan, key):
    return sorted((r.region.starts[0], r.region.stops[0], r.scale_region.starts[0],
                   r.scale_region.stops[0]) for s in plan.schedule.steps for r in s.reads
                  if r.entry.key.endswith(key))


def test_a_shard_inside_a_block_reads_the_covering_tiles(fp8_checkpoints):
    """192 rows, 2 scale rows, 2 ranks: rank 0 reads rows 0–96 and scale row 0; rank 1 rows
    96–192, which start mid-block, and both scale rows."""
    key = "layers.0.self_attn.kv_a_proj_with_mqa.weight"
    _, r0 = rank_load(fp8_checkpoints, "dsv3", MLA, 2, 0)
    _, r1 = rank_load(fp8_checkpoints, "dsv3", MLA, 2, 1)
    assert scale_rows(r0, key) == [(0, 96, 0, 1)]
    assert scale_rows(r1, key) == [(96, 192, 0, 2)]
    _, q1 = rank_load(fp8_checkpoints, "llama", "auto", 2, 1)  # q_proj 256 rows: rows 128–256
    assert scale_rows(q1, "layers.0.self_attn.q_proj.weight") == [(128, 256, 1, 2)]


ALIGNED = {"model.layers.*.self_attn.q_proj": "colwise", "model.layers.*.self_attn.o_proj": "rowwise"}


def test_keep_fp8_shards_weight_and_scale_alike(fp8_checkpoints):
    full = full_load(fp8_checkpoints, "mixtral", fp8=True)
    for rank in range(2):
        model, p = rank_load(fp8_checkpoints, "mixtral", ALIGNED, 2, rank, fp8=True)
        assert not p.problems, str(p)
        assert p.sharding.plan.placement("model.layers.0.self_attn.o_proj.weight_scale_inv").is_sharded
        p.execute()
        check_rank(model, p, full, 2, rank)


def test_keep_fp8_split_inside_a_block_is_a_problem_on_every_rank(fp8_checkpoints):
    for rank in range(2):  # k_proj: 128 rows, one scale row, 64 rows per rank
        model, p = rank_load(fp8_checkpoints, "llama", "auto", 2, rank, fp8=True)
        keys = {x.key for x in p.problems}
        assert "model.layers.0.self_attn.k_proj.weight" in keys, str(p)
        assert "model.layers.0.self_attn.q_proj.weight" not in keys
        with pytest.raises(QuantizationError, match="inside a 128×128 block"):
            p.execute()


def test_empty_and_mid_block_shards_of_a_hand_built_checkpoint(tmp_path):
    """3 rows over 4 ranks (rank 3 holds none) and 200 columns over 3 ranks (67, 67, 66:
    every boundary inside a 128-block), against the ceil-block reference."""
    import json

    from tests.conftest import module_with, write_checkpoint
    from tests.fp8.checkpoints import QUANT_CONFIG, ref_dequant, ref_quant

    torch.manual_seed(0)
    weights = {"a.weight": torch.randn(3, 300), "b.weight": torch.randn(260, 200)}
    tensors = {}
    for key, w in weights.items():
        tensors[key], tensors[key + "_scale_inv"] = ref_quant(w)
    ckpt = write_checkpoint(tmp_path / "ckpt", tensors)
    (ckpt / "config.json").write_text(json.dumps({"quantization_config": QUANT_CONFIG}))
    specs = {k: (tuple(w.shape), torch.bfloat16) for k, w in weights.items()}
    for key, style, world in (("a.weight", "colwise", 4), ("b.weight", "rowwise", 3)):
        full = ref_dequant(tensors[key], tensors[key + "_scale_inv"])
        for rank in range(world):
            model = module_with(specs)
            tp = TensorParallel(world_size=world, rank=rank, output="local",
                                plan={key.removesuffix(".weight"): style})
            p = weightplan.explain(model, ckpt, tp=tp)
            assert not p.problems, str(p)
            p.execute()
            placement = p.sharding.plan.placement(key).normalized(2)
            assert torch.equal(dict(model.named_parameters())[key].data,
                               slice_local(full, placement, world, rank)), (key, rank)


def test_real_gloo_ranks_dequantize_their_slices(fp8_checkpoints, tmp_path):
    """Two torchrun ranks on gloo (weightplan's own mesh, DTensor output) load the llama FP8
    checkpoint (64-row k/v shards) dequantized to fp32: each local tensor is its split of
    the non-TP load, and each rank needs no more than its local bytes and scale tiles."""
    from tests.parallel.conftest import LOADER, torchrun
    from tests.parallel.tp_load_worker import meta_model as auto_meta_model
    from weightplan.planner.core.sharding.placements import Placement

    fp8_dir = fp8_checkpoints("llama")[1]
    torchrun(2, LOADER, str(tmp_path), f"wp:{fp8_dir}")
    reference = auto_meta_model(str(fp8_dir))
    weightplan.explain(reference, fp8_dir).execute()
    full = {n: p.data for n, p in reference.named_parameters()}
    for rank in range(2):
        dump = torch.load(tmp_path / f"{fp8_dir.name}.wp2.rank{rank}.pt")
        needed, local = dump.pop("__bytes__")
        tiles = 2 * 2 * 4 * 2 * 7  # ≤ 2 tile rows × 2 tile cols × fp32, 7 weights × 2 layers
        assert needed <= 1.02 * local + tiles
        for name, (tensor, placements, _) in dump.items():
            placement = Placement.plain() if placements is None else (
                Placement.shard(placements[0][1]))
            assert tensor.dtype == torch.float32
            assert torch.equal(tensor, slice_local(full[name], placement, 2, rank)), name
