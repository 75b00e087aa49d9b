"""Cooperative reads on gloo (torchrun, 2 and 4 ranks): each replicated tensor is read from
storage by one rank and broadcast; the ranks together read the checkpoint about once
(≤ 1.05×), and every rank's tensors equal the plain TP load's bit for bit. Plain loads of
the same hidden-512 checkpoints request ≤ 1.05× the bytes each rank needs (strided reads).
4 ranks as 2 nodes × 2 with a copy of the checkpoint on each node: each node reads what
its ranks hold about once (their shards, the replicated tensors once).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.parallel.conftest import torchrun
from tests.parallel.strided_fixtures import build

WORKER = Path(__file__).with_name("coop_worker.py")
FIXTURES = {2: (("mixtral", 1),), 4: (("dsv3", 0), ("dsv3", 1))}  # 1: FP8, 0: bf16
WAYS = {2: "plain,coop", 4: "plain,coop,node,auto,autocoop"}  # node: 4 ranks as 2 nodes × 2
# auto: the model's own plan (transformers 5.25: the fused experts whole on every rank)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("coop")
    out = root / "out"
    out.mkdir()
    names = {}
    for world, fixtures in FIXTURES.items():
        dirs = [build(name, root / "ckpt")[fp8] for name, fp8 in fixtures]
        torchrun(world, WORKER, str(out), WAYS[world], *map(str, dirs), timeout=600)
        names[world] = [d.name for d in dirs]
    return out, names


def dumps(out: Path, name: str, way: str, world: int) -> list[dict]:
    return [torch.load(out / f"{name}.{way}{world}.rank{r}.pt") for r in range(world)]


@pytest.mark.parametrize("world", sorted(FIXTURES))
def test_cooperative_ranks_read_the_checkpoint_once_and_equal_the_plain_load(loaded, world):
    out, names = loaded
    for name in names[world]:
        plain, coop = dumps(out, name, "plain", world), dumps(out, name, "coop", world)
        total = plain[0]["checkpoint_bytes"]
        for p, c in zip(plain, coop, strict=True):
            assert p["tensors"].keys() == c["tensors"].keys()
            for key, tensor in p["tensors"].items():
                assert torch.equal(tensor, c["tensors"][key]), (name, key)
            assert p["bytes_read"] <= 1.05 * p["bytes_needed"], name  # strided reads
            assert p["network_bytes"] == 0 and c["network_bytes"] > 0
        # plain: every rank reads the replicated tensors (DeepSeek-V3's MLA: 1.4× on 4, by
        # the worker's plan: transformers 5.24's, which keeps it whole; 5.25's shards it)
        assert sum(c["bytes_read"] for c in coop) < sum(p["bytes_read"] for p in plain)
        if name.startswith("dsv3"):
            assert sum(p["bytes_read"] for p in plain) > 1.2 * total
        assert sum(c["bytes_read"] for c in coop) <= 1.05 * total, name
        # balanced: no rank reads more than its share plus the largest replicated step
        assert max(c["bytes_read"] for c in coop) <= 1.5 * total / world, name


def test_two_nodes_with_a_copy_each_read_it_once_per_node(loaded):
    out, names = loaded
    for name in names[4]:
        plain, node = dumps(out, name, "plain", 4), dumps(out, name, "node", 4)
        total = plain[0]["checkpoint_bytes"]
        for p, n in zip(plain, node, strict=True):
            for key, tensor in p["tensors"].items():
                assert torch.equal(tensor, n["tensors"][key]), (name, key)
            assert n["network_bytes"] > 0
        coop = dumps(out, name, "coop", 4)
        # the replicated bytes R: plain reads them on 4 ranks, coop once, node once per node
        read = {way: sum(d["bytes_read"] for d in ds) for way, ds in
                (("plain", plain), ("coop", coop), ("node", node))}
        replicated = (read["plain"] - read["coop"]) / 3
        assert replicated > 0.1 * total
        assert abs(read["node"] - (read["coop"] + replicated)) <= 0.01 * total, read
        for ranks in ((0, 1), (2, 3)):  # a node: its shards and the replicated bytes, once
            sharded = sum(plain[r]["bytes_read"] for r in ranks) - 2 * replicated
            assert sum(node[r]["bytes_read"] for r in ranks) <= 1.05 * (sharded + replicated)


def test_a_replicated_tensor_larger_than_a_share_is_cut_between_readers(loaded):
    # DeepSeek-V3 by the model's own plan on 4 ranks: its fused expert stack (4 MiB of a
    # 14.9 MiB checkpoint) is whole on every rank; dealt whole, one rank read 1.6× its share
    out, names = loaded
    for name in names[4]:
        plain, coop = dumps(out, name, "auto", 4), dumps(out, name, "autocoop", 4)
        total = plain[0]["checkpoint_bytes"]
        stack = "model.layers.1.mlp.experts.gate_up_proj"
        whole = plain[0]["tensors"][stack].shape == (4, 1024, 512)  # (5.24's plan splits it)
        assert all((stack in c["cut"]) == whole for c in coop)
        for p, c in zip(plain, coop, strict=True):
            assert p["tensors"].keys() == c["tensors"].keys()
            for key, tensor in p["tensors"].items():
                assert torch.equal(tensor, c["tensors"][key]), (name, key)
        assert sum(c["bytes_read"] for c in coop) <= 1.05 * total, name
        assert max(c["bytes_read"] for c in coop) <= 1.05 * total / 4, \
            (name, [c["bytes_read"] / (total / 4) for c in coop])


@pytest.mark.parametrize("fp8", [0, 1])
def test_the_dry_run_cuts_a_stack_larger_than_a_share_into_byte_ranges(tmp_path, fp8):
    # the experts whole on every rank (no rule names them: 5.25's plan, on any version)
    from weightplan.cli import _model_for
    from weightplan.parallel import TensorParallel
    from weightplan.planner.inputs.parallel_plan import plan_rules
    from weightplan.planner.pipelines.ranks import plan_ranks

    directory = str(build("dsv3", tmp_path)[fp8])
    model, dtype, _ = _model_for(directory, None)
    rules = {rule: style for rule, style in
             plan_rules(model, TensorParallel(world_size=1, rank=0)).items()
             if ".experts" not in rule}
    tp = TensorParallel(world_size=4, rank=0, output="local", cooperative=True, plan=rules)
    plans = plan_ranks(model, directory, tp, dtype=dtype)
    total = plans[0].checkpoint.nbytes
    assert sum(p.read_bytes for p in plans) <= 1.05 * total
    assert max(p.read_bytes for p in plans) <= 1.05 * total / 4  # (dealt whole: 1.6×)
    items = plans[0].exchange.items
    assert all(p.exchange.items == items for p in plans)
    stack = "model.layers.1.mlp.experts.gate_up_proj"
    parts = sorted((i for i in items if i.key == stack), key=lambda i: i.start)
    size = next(d.spec.nbytes for s in plans[0].schedule.steps for d in s.destinations
                if d.key == stack)
    assert len({i.slot for i in parts}) == len(parts) > 1
    assert [i.start for i in parts] == [0, *(i.start + i.nbytes for i in parts[:-1])]
    assert parts[-1].start + parts[-1].nbytes == size
    for p in plans:  # each reader reads its part's experts, the others none of them
        step = next(s for s in p.schedule.steps if s.destinations[0].key == stack)
        mine = sum(i.nbytes for i in parts if i.slot == p.exchange.slot)
        itemsize = size // (4 * 1024 * 512)
        assert sum(r.fragment.view.numel for r in step.reads) * itemsize == mine


def test_a_cooperative_dry_run_plans_and_shows_its_exchange_but_does_not_execute(tmp_path):
    import weightplan
    from tests.parallel.test_strided_reads import meta
    from weightplan.errors import ParallelError
    from weightplan.parallel import TensorParallel

    directory = build("dsv3", tmp_path)[0]
    tp = TensorParallel(world_size=2, rank=1, output="local")
    plain = weightplan.explain(meta("dsv3"), directory, tp=tp)
    plan = weightplan.explain(meta("dsv3"), directory, tp=tp, cooperative=True)
    exchange = plan.exchange
    assert plain.exchange is None and exchange is not None and exchange.rank == 1
    assert {exchange.owner(i) for i in exchange.items} == {0, 1}
    assert plan.read_bytes < plain.read_bytes  # what rank 0 reads, rank 1 receives
    assert exchange.received_bytes == sum(i.nbytes for i in exchange.items
                                          if exchange.owner(i) == 0)
    assert plan.peak_bytes >= plan.held_bytes  # received tensors land in their own memory
    assert "cooperative rank 1 of 2: storage" in str(plan)
    with pytest.raises(ParallelError, match="needs a process group"):
        plan.execute()
    with pytest.raises(ParallelError, match="pass tp= too"):
        weightplan.explain(meta("dsv3"), directory, cooperative=True)


def test_bad_node_layouts_are_refused():
    from weightplan.errors import ParallelError
    from weightplan.parallel import TensorParallel

    for bad in ({"local_world_size": 3, "world_size": 4, "rank": 0},
                {"local_world_size": 0}, {"storage": "nfs"}, {"cooperative": "yes"}):
        with pytest.raises(ParallelError, match="TensorParallel"):
            TensorParallel(**bad)


class _Mesh:
    """A 1-D mesh of these global ranks (what ``ranks_per_node`` reads of a DeviceMesh)."""

    def __init__(self, ranks):
        self.mesh = torch.tensor(ranks)


def test_nodes_are_read_off_the_mesh_ranks(monkeypatch):
    """torchrun's LOCAL_WORLD_SIZE counts a node's ranks of the whole world: a TP sub-mesh
    (pairs of a 2 × 2 data × tensor mesh) has its own count, and only ``storage="node"``
    asks for one (a plain or shared load doesn't depend on the nodes)."""
    from weightplan.errors import ParallelError
    from weightplan.parallel import TensorParallel
    from weightplan.planner.core.sharding.config import Ranks

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    node = TensorParallel(cooperative=True, storage="node")
    for tp in (TensorParallel(), TensorParallel(cooperative=True), node):
        assert tp.ranks_per_node(Ranks(2, 1, _Mesh([2, 3]))) == 2
    assert node.ranks_per_node(Ranks(2, 0, _Mesh([0, 4]))) == 1  # one rank on each node
    assert node.ranks_per_node(Ranks(8, 0, _Mesh(list(range(8))))) == 4
    with pytest.raises(ParallelError, match=r"nodes \[0, 1, 0\]"):
        node.ranks_per_node(Ranks(3, 0, _Mesh([0, 4, 1])))
