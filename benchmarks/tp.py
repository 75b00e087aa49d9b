"""Tensor-parallel benchmark: weightplan vs transformers ``tp_plan="auto"``, 2 and 4 gloo ranks.

Uses the ~1.5 GB Mixtral-style checkpoint of ``benchmarks/load.py`` (legacy per-expert
layout, so the expert merges are sharded). For each world size, one torchrun launch runs
on every rank, in alternating order: weightplan (``explain(model, dir, tp=TensorParallel())``
+ ``execute`` into a model built under ``init_empty``) and transformers
(``from_pretrained(dir, distributed_config=DistributedConfig(tp_plan="auto"))``). Per rank it
reports the bytes weightplan read against 1/N of the checkpoint, the load seconds of both,
and the growth of peak RSS during each load (each in its own fresh process).

    python benchmarks/tp.py [--ranks 2 4] [--cache DIR]
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


def _weightplan(directory: str) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import weightplan

    with weightplan.init_empty():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory),
                                                 dtype=torch.bfloat16)
    before, start = _peak_rss(), time.perf_counter()
    plan = weightplan.explain(model, directory, tp=weightplan.TensorParallel())
    report = plan.execute(progress=False)
    seconds = time.perf_counter() - start
    local = sum(p.to_local().nbytes if hasattr(p, "to_local") else p.nbytes
                for p in model.parameters())
    return {"seconds": seconds, "read": report.bytes_needed, "local": local,
            "rss": _peak_rss() - before}


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

    if contender == "weightplan":
        dist.init_process_group("gloo")
        result = _weightplan(directory)
    else:
        result = _transformers(directory)
    result.update(rank=dist.get_rank(), contender=contender)
    print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def launch(world: int, contender: str, directory: Path) -> list[dict]:
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
    print(f"{'rank':>4} {'wp read/(total/N)':>18} {'wp read/local':>14} {'wp s':>7} "
          f"{'hf s':>7} {'wp peak RSS':>12} {'hf peak RSS':>12}")
    wp = {r["rank"]: r for r in runs if r["contender"] == "weightplan"}
    hf = {r["rank"]: r for r in runs if r["contender"] == "transformers"}
    for rank in sorted(wp):
        a, b = wp[rank], hf.get(rank, {"seconds": float("nan"), "rss": 0})
        print(f"{rank:>4} {a['read'] / (total / world):>18.3f} {a['read'] / a['local']:>14.3f} "
              f"{a['seconds']:>7.2f} {b['seconds']:>7.2f} {a['rss'] / gib:>10.2f} G "
              f"{b['rss'] / gib:>10.2f} G")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--cache", type=Path, default=None)
    args = parser.parse_args()
    from benchmarks.load import DEFAULT_CACHE, build_checkpoint

    directory = args.cache or DEFAULT_CACHE
    build_checkpoint(directory)
    total = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    for world in args.ranks:
        runs = []
        for contender in ("weightplan", "transformers", "weightplan", "transformers")[
                :2 if world > 2 else 4]:
            runs += launch(world, contender, directory)
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
