"""Tensors a checkpoint lacks, under tensor parallel (gloo, 2 ranks, real processes): the
model's init runs on every rank, and a tensor every rank holds whole (a router, a norm) must
be the same tensor on every rank, or the ranks run different models (each routes tokens its
own way) — the first rank's init is broadcast to the others. A sharded one is that tensor's
part, placed as a loaded one (it was the whole tensor, plain, and the forward failed); the
model's logits equal one process's model holding the same tensors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.parallel.conftest import torchrun

WORKER = Path(__file__).with_name("init_worker.py")
DROPPED = {"model.layers.0.block_sparse_moe.gate.weight": "model.layers.0.mlp.gate.weight",
           "model.layers.0.self_attn.q_proj.weight": "model.layers.0.self_attn.q_proj.weight"}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, tp_checkpoints):
    root = tmp_path_factory.mktemp("tp_missing")
    directory = root / "ckpt"
    shutil.copytree(tp_checkpoints["mixtral"], directory)
    tensors = load_file(directory / "model.safetensors")
    for key in DROPPED:
        del tensors[key]
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    torchrun(2, WORKER, str(root), str(directory), timeout=240)
    return directory, [torch.load(root / f"rank{r}.pt") for r in (0, 1)]


def test_a_missing_replicated_tensor_is_the_same_on_every_rank(ranks):
    _, ranks = ranks
    for rank in ranks:
        assert set(rank["initialized"]) == set(DROPPED.values())
    router, _ = DROPPED.values()
    (mine, sharded), (theirs, _) = ranks[0]["tensors"][router], ranks[1]["tensors"][router]
    assert not sharded and mine.abs().sum() > 0
    assert torch.equal(mine, theirs)


def test_a_missing_sharded_tensor_is_this_ranks_part(ranks):
    _, ranks = ranks
    _, q_proj = DROPPED.values()
    (mine, sharded), (theirs, _) = ranks[0]["tensors"][q_proj], ranks[1]["tensors"][q_proj]
    assert sharded and mine.shape == theirs.shape == (32, 64)
    assert mine.abs().sum() > 0 and theirs.abs().sum() > 0


def test_the_model_runs_as_one_process_holding_the_same_tensors(ranks):
    import transformers

    from tests.parallel.tp_load_worker import PROMPT

    directory, ranks = ranks
    router, q_proj = DROPPED.values()
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        model.get_parameter(router).copy_(ranks[0]["tensors"][router][0])
        model.get_parameter(q_proj).copy_(torch.cat([r["tensors"][q_proj][0] for r in ranks]))
        want = model(PROMPT).logits
    for rank in ranks:
        assert (rank["logits"] - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("style", ["colwise", "rowwise"])
def test_a_missing_sharded_tensor_holds_only_its_part(tmp_path, style):
    """The part kept is a tensor of its own: a view of the whole init kept the whole
    tensor's storage alive on every rank (world × the bytes the plan counts for it)."""
    import weightplan
    from tests.conftest import module_with, write_checkpoint
    from weightplan.parallel import TensorParallel

    ckpt = write_checkpoint(tmp_path / "ckpt", {"emb.weight": torch.randn(8, 4)})
    model = module_with({"emb.weight": ((8, 4), torch.float32),
                         "head.weight": ((8, 4), torch.float32)})
    tp = TensorParallel(world_size=2, rank=1, plan={"emb": "embedding_rowwise", "head": style},
                        output="local")
    assert set(weightplan.explain(model, ckpt, tp=tp).execute().initialized) == {"head.weight"}
    head = model.head.weight
    assert head.shape == ((4, 4) if style == "colwise" else (8, 2))
    assert head.untyped_storage().nbytes() == head.numel() * head.element_size()
