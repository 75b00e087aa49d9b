"""Packed checkpoints under torchrun on gloo (the parallel tests' loader worker): every
rank's local parameters (TP over 2 and 4 ranks, EP over 2) equal the single-process
dequantizing load's DTensor split bit for bit, and each rank reads at most 1.05× its
share of the stored bytes (codes, scale tiles, zero points; plain tensors whole or split)."""

import pytest
import torch

import weightplan
from tests.parallel.conftest import LOADER, torchrun
from tests.parallel.tp_load_worker import meta_model
from tests.quant.checkpoints import quantized_checkpoint
from tests.quant.test_quant_tp_slices import WIDE, plain_keys, stored_per_element
from weightplan.planner.core.sharding.placements import Placement
from weightplan.planner.core.sharding.shard_math import slice_local

pytest.importorskip("compressed_tensors")

KINDS = ("int-asym", "nvfp4")
JOBS = {2: ("wp", "ep"), 4: ("wp",)}


@pytest.fixture(scope="module")
def gloo_loads(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant_gloo")
    dirs = {k: quantized_checkpoint(root, k, name=WIDE) for k in KINDS}
    out = root / "out"
    out.mkdir()
    for world, hows in JOBS.items():
        torchrun(world, LOADER, str(out), *(f"{h}:{dirs[k][0]}" for h in hows for k in KINDS),
                 timeout=300)
    return dirs, out


def _placement(dumped: tuple | None) -> Placement | None:
    """A dumped DTensor placement (``(class name, dim, split factor)``) as the planner's
    (``None``: the rank holds the whole tensor)."""
    if dumped is None:
        return None
    (name, dim, factor), = dumped
    if name == "Shard":
        return Placement.shard(dim)
    return Placement.strided(dim, factor) if name == "_StridedShard" else None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how, world", [("wp", 2), ("ep", 2), ("wp", 4)])
def test_gloo_ranks_equal_the_split_single_process_load(gloo_loads, kind, how, world):
    dirs, out = gloo_loads
    qdir, odir = dirs[kind]
    model = meta_model(str(qdir))
    weightplan.load(model, qdir)
    full = {n: p.data for n, p in model.named_parameters()}
    per_element, plain = stored_per_element(qdir, odir), plain_keys(qdir, odir)
    for rank in range(world):
        ours = torch.load(out / f"{qdir.name}.{how}{world}.rank{rank}.pt")
        want_bytes = 0.0
        for name, tensor in full.items():
            local, placements, shape = ours[name]
            assert shape == tuple(tensor.shape), name
            placement = _placement(placements)
            want = tensor if placement is None else slice_local(tensor, placement, world, rank)
            assert torch.equal(local, want), (name, rank)
            want_bytes += local.numel() * (2 if name in plain else per_element)
        needed, _ = ours["__bytes__"]
        assert needed <= 1.05 * want_bytes, (rank, needed, want_bytes)
