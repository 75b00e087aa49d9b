"""weightplan under torchrun on gloo: DTensor parameters equal transformers' own TP load
bit for bit (local tensors, placements, global shapes), each rank reads only its bytes, and
a TP forward through the transformers-prepared model matches the single-process logits."""

import pytest
import torch

from tests.parallel.conftest import LOAD_JOBS
from tests.parallel.test_tp_oracle import meta_model
from tests.parallel.tp_load_worker import PROMPT

CASES = [(n, how, world) for world, jobs in LOAD_JOBS.items() for how, names in jobs
         for n in names]


@pytest.mark.parametrize("fixture, how, world", CASES)
def test_dtensors_equal_transformers_tp(tp_oracle, tp_loaded, fixture, how, world):
    import transformers

    shapes = {n: tuple(p.shape) for n, p in meta_model(fixture).named_parameters()}
    for rank in range(world):
        ours = torch.load(tp_loaded / f"{fixture}.{how}{world}.rank{rank}.pt")
        theirs = tp_oracle.rank(fixture, "ep" if how.endswith("ep") else "tp", world, rank)
        for name, (local, placements) in theirs.items():
            mine, my_placements, global_shape = ours[name]
            assert torch.equal(mine, local), name
            assert my_placements == placements, name
            assert global_shape == shapes[name], name
        needed, local_bytes = ours["__bytes__"]
        assert needed <= 1.02 * local_bytes, (rank, needed, local_bytes)
    if how == "hf":
        reference = transformers.AutoModelForCausalLM.from_pretrained(
            tp_oracle.checkpoints[fixture], dtype=torch.float32)
        with torch.no_grad():
            want = reference(PROMPT).logits
        for rank in range(world):
            got = torch.load(tp_loaded / f"{fixture}.{how}{world}.rank{rank}.pt")["__logits__"]
            assert (got - want).abs().max().item() <= 1e-6


@pytest.mark.parametrize("fixture, how, world", [c for c in CASES if c[1].startswith("coop")])
def test_cooperative_loads_read_each_byte_on_one_rank(tp_loaded, fixture, how, world):
    """Cooperative loads (equal to transformers' tp_plan="auto" above): storage bytes per
    rank, as the executor requested them. Every checkpoint byte is needed by exactly one
    rank (the shards split, each replicated tensor read by one rank and broadcast). What
    the ranks request beyond that is exactly the gaps of the column slices the cost model
    reads as the span enclosing their row segments (strided.py: a read call costs
    CALL_BYTES), and only where that span costs no more than a call per segment. Here
    (hidden 64, fp32) a column half is 128-byte segments with 128-byte gaps, a call's
    worth: on 2 ranks the rank holding a row-parallel o_proj / down_proj reads its span
    (up to 1.29× the checkpoint in all); on 4 ranks the gaps are 3× the segments and no
    span is read. At hidden 512 the segments are read (test_cooperative.py: ≤ 1.05×)."""
    from weightplan.planner.tensors.lower.strided import CALL_BYTES

    dumps = [torch.load(tp_loaded / f"{fixture}.{how}{world}.rank{r}.pt") for r in range(world)]
    read = [d["__storage__"][0] for d in dumps]
    needed = [d["__bytes__"][0] for d in dumps]
    total = dumps[0]["__storage__"][1]
    assert sum(needed) == total, (fixture, needed, total)
    for rank, dump in enumerate(dumps):
        gaps = 0
        for key, requested, need, run, count, span in dump["__spans__"]:
            assert need == run * count and requested == span, (key, requested, need, span)
            assert count * CALL_BYTES + need >= CALL_BYTES + span, key  # the span: cheaper
            gaps += span - need
        assert read[rank] == needed[rank] + gaps, (rank, read, needed, gaps)
        if world == 4:
            assert not dump["__spans__"] and read[rank] == needed[rank]
    assert all(d["__storage__"][2] > 0 for d in dumps)


@pytest.mark.parametrize("fixture, how, world", CASES)
def test_saving_the_sharded_model_writes_the_checkpoint_back(tp_checkpoints, tp_loaded, fixture,
                                                            how, world):
    from safetensors.torch import load_file

    original = load_file(str(tp_checkpoints[fixture] / "model.safetensors"))
    saved = load_file(str(tp_loaded / f"{fixture}.{how}{world}.saved" / "model.safetensors"))
    assert saved.keys() == original.keys()
    for key, tensor in original.items():
        assert saved[key].dtype == tensor.dtype and saved[key].shape == tensor.shape, key
        assert torch.equal(saved[key].view(torch.uint8), tensor.view(torch.uint8)), key
