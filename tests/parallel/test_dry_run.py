"""The dry run of every rank (``weightplan explain DIR --tp N [--ep] [--cooperative]``)
plans what no rank changes once, then each rank from it: its per-rank figures (storage,
network, held, replicated, peak) and its reads are those of that rank's own plan, made
alone as a real rank makes it, for Llama, Mixtral and DeepSeek-V3 layouts, bf16 and FP8
(kept, with its scales, as the command line builds the model), TP 2/4/8 with and without
expert parallelism, cooperative and on nodes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.parallel.strided_fixtures import NAMES, build
from weightplan.cli import _model_for, main
from weightplan.parallel import TensorParallel
from weightplan.planner.pipelines.load import explain_load
from weightplan.planner.pipelines.ranks import plan_ranks, rank_rows

CASES = [  # (family, fp8, world, ep, cooperative, nodes)
    ("dsv3", True, 2, True, False, None),
    ("dsv3", True, 4, True, True, 2),
    ("dsv3", False, 4, False, True, None),
    ("mixtral", True, 4, True, False, None),
    ("mixtral", False, 2, True, True, None),
    ("llama", True, 8, False, False, None),
    ("llama", False, 8, False, True, 2),
]


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    root = tmp_path_factory.mktemp("dry_run")
    return {name: build(name, root) for name in NAMES}


def _tp(world, ep, cooperative, nodes, rank=0):
    return TensorParallel(world_size=world, rank=rank, experts="ep" if ep else "tp",
                          output="local", cooperative=cooperative,
                          local_world_size=None if nodes is None else world // nodes)


def _reads(plan):
    return [(s.label, tuple((r.entry.key, r.region.starts, r.region.stops) for r in s.reads),
             tuple((d.key, d.spec.shape) for d in s.destinations)) for s in plan.schedule.steps]


@pytest.mark.parametrize("name, fp8, world, ep, cooperative, nodes", CASES)
def test_each_ranks_figures_are_its_own_plans(wide, name, fp8, world, ep, cooperative, nodes):
    directory = str(wide[name][1 if fp8 else 0])
    model, dtype, _ = _model_for(directory, None)
    tp = _tp(world, ep, cooperative, nodes)
    dry = plan_ranks(model, directory, tp, dtype=dtype)
    assert [p.sharding.rank for p in dry] == list(range(world))
    if fp8:
        assert any(s.quantized or any("scale_inv" in d.key for d in s.destinations)
                   for s in dry[0].schedule.steps)
    for rank in sorted({0, 1, world - 1}):
        alone = explain_load(model, directory, dtype=dtype,
                             tp=dataclasses.replace(tp, rank=rank))
        assert rank_rows((alone,)) == rank_rows((dry[rank],))
        assert _reads(alone) == _reads(dry[rank])
        assert alone.problems == dry[rank].problems
        if cooperative:
            assert alone.exchange == dry[rank].exchange
    rows = rank_rows(dry)
    assert _reads(dry[0]) != _reads(dry[1])  # (the ranks' plans differ: a real comparison)
    assert all(r["peak_bytes"] > 0 for r in rows)
    if cooperative:  # each replicated tensor read once per broadcast group
        assert sum(r["network_bytes"] for r in rows) > 0


def test_the_command_prints_the_dry_run_figures(wide, capsys):
    # (Mixtral FP8: the same plan on any transformers. DeepSeek-V3's MLA is column-sharded
    # from 5.25 on, and this one's kv_b_proj, 768 rows, can't keep FP8 on 4 ranks: a problem)
    directory = str(wide["mixtral"][1])
    assert main(["explain", directory, "--tp", "4", "--ep", "--cooperative", "--nodes", "2",
                 "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    model, dtype, _ = _model_for(directory, None)
    alone = explain_load(model, directory, dtype=dtype, tp=_tp(4, True, True, 2, rank=3))
    assert printed[3] == rank_rows((alone,))[0]
    assert main(["explain", directory, "--tp", "4", "--ep", "--cooperative", "--nodes",
                 "2"]) == 0
    table = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(table) if line.split()[:2] == ["rank", "storage"])
    assert table[head].split()[-1] == "storage/(total/N)"
    assert [line.split()[0] for line in table[head + 1:head + 5]] == ["0", "1", "2", "3"]
