"""Tensor-parallel benchmark: weightplan (plain and cooperative) vs transformers
``tp_plan="auto"``, 2 and 4 gloo ranks.

Uses the ~1.5 GB Mixtral-style checkpoint of ``benchmarks/load.py`` (legacy per-expert
layout, so the expert merges are sharded). For each world size, one torchrun launch per
contender runs on every rank, in alternating order, each on a cold page cache (the
checkpoint's pages dropped first): weightplan (``explain(model, dir, tp=TensorParallel())``
+ ``execute`` into a model built under ``init_empty``), weightplan cooperative
(``TensorParallel(cooperative=True)``: each replicated tensor read by one rank and
broadcast) and transformers (``from_pretrained(dir, distributed_config=DistributedConfig(
tp_plan="auto"))``). Per rank it reports the bytes weightplan requested from storage
(``report.bytes_read``: read calls plus mapped windows) against 1/N of the checkpoint and
against the bytes the rank needs, the load seconds of each, and the growth of peak RSS
(each in its own fresh process); per world size, the storage bytes of all ranks against
the checkpoint's.

    python benchmarks/tp.py [--ranks 2 4] [--cache DIR] [--warm]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _weightplan(directory: str, cooperative: bool = False) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import weightplan

    with weightplan.init_empty():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory),
                                                 dtype=torch.bfloat16)
    before, start = _peak_rss(), time.perf_counter()
    plan = weightplan.explain(model, directory,
                              tp=weightplan.TensorParallel(cooperative=cooperative))
    report = plan.execute(progress=False)
    seconds = time.perf_counter() - start
    local = sum(p.to_local().nbytes if hasattr(p, "to_local") else p.nbytes
                for p in model.parameters())
    return {"seconds": seconds, "read": report.bytes_read, "needed": report.bytes_needed,
            "local": local, "rss": _peak_rss() - before}


def _transformers(directory: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    before, start = _peak_rss(), time.perf_counter()
    AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16,
                                         distributed_config=DistributedConfig(tp_plan="auto"))
    return {"seconds": time.perf_counter() - start, "rss": _peak_rss() - before}


def worker(contender: str, directory: str) -> None:
    """One contender on this rank; prints one JSON line."""
    import torch.distributed as dist

    if contender in ("weightplan", "cooperative"):
        dist.init_process_group("gloo")
        result = _weightplan(directory, cooperative=contender == "cooperative")
    else:
        result = _transformers(directory)
    result.update(rank=dist.get_rank(), contender=contender)
    print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def launch(world: int, contender: str, directory: Path, cold: bool = True) -> list[dict]:
    if cold:
        from weightplan.executor.reader import evict

        for path in directory.glob("*.safetensors"):
            evict(path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}",
           "--master-addr=127.0.0.1", f"--master-port={port}", __file__, "--worker",
           contender, str(directory)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env, check=True)
    return [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]


def report(world: int, total: int, runs: list[dict]) -> None:
    gib = 1024 ** 3
    print(f"\n{world} ranks, checkpoint {total / gib:.2f} GiB, 1/{world} = "
          f"{total / world / gib:.3f} GiB")
    print(f"{'rank':>4} {'storage/(total/N)':>18} {'coop':>6} {'storage/needed':>15} "
          f"{'wp s':>7} {'coop s':>7} {'hf s':>7} {'wp peak RSS':>12} {'hf peak RSS':>12}")
    by = {c: {r["rank"]: r for r in runs if r["contender"] == c}
          for c in ("weightplan", "cooperative", "transformers")}
    nan = {"seconds": float("nan"), "rss": 0, "read": float("nan")}
    for rank in sorted(by["weightplan"]):
        a, c = by["weightplan"][rank], by["cooperative"].get(rank, nan)
        b = by["transformers"].get(rank, nan)
        print(f"{rank:>4} {a['read'] / (total / world):>18.3f} "
              f"{c['read'] / (total / world):>6.3f} {a['read'] / a['needed']:>15.3f} "
              f"{a['seconds']:>7.2f} {c['seconds']:>7.2f} {b['seconds']:>7.2f} "
              f"{a['rss'] / gib:>10.2f} G {b['rss'] / gib:>10.2f} G")
    wall = {c: max((r["seconds"] for r in rows.values()), default=float("nan"))
            for c, rows in by.items()}  # (a load is done when its slowest rank is)
    for contender in ("weightplan", "cooperative"):
        storage = sum(r["read"] for r in by[contender].values())
        print(f"{contender}: all ranks' storage bytes / checkpoint = {storage / total:.3f}; "
              f"wall {wall[contender]:.2f} s = {wall[contender] / wall['transformers']:.2f}× "
              f"transformers tp_plan=\"auto\" ({wall['transformers']:.2f} s), "
              f"{wall[contender] / wall['weightplan']:.2f}× the non-cooperative load")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--warm", action="store_true", help="keep the page cache (default: "
                        "each launch starts cold)")
    args = parser.parse_args()
    from benchmarks.load import DEFAULT_CACHE, build_checkpoint

    directory = args.cache or DEFAULT_CACHE
    build_checkpoint(directory)
    total = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    for world in args.ranks:
        runs = []
        order = ("weightplan", "cooperative", "transformers") * (1 if world > 2 else 2)
        for contender in order:
            runs += launch(world, contender, directory, cold=not args.warm)
        report(world, total, _best(runs))


def _best(runs: list[dict]) -> list[dict]:
    """Per rank and contender, the fastest of the repeats."""
    best: dict[tuple[int, str], dict] = {}
    for r in runs:
        key = (r["rank"], r["contender"])
        if key not in best or r["seconds"] < best[key]["seconds"]:
            best[key] = r
    return list(best.values())


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main()
