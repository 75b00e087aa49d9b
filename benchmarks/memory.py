"""Memory benchmark: the planner's peak estimate against the process's measured memory.

Two checkpoints, both in the legacy per-expert Mixtral layout, bf16:

* ``mixtral``  the ~1.5 GB checkpoint of ``benchmarks/load.py`` (8 layers x 8 experts)
* ``big-group`` one layer with 64 big experts: its fused ``gate_up_proj`` alone is two
  thirds of the model, the case where a loader that stacks in a temporary doubles its peak

Each case runs in a fresh process: unbudgeted with the thread pool, unbudgeted inline
(``threads=0``), and with ``budget = model bytes + 10%``. The process's resident memory is
sampled every millisecond by a thread and its kernel-kept peak (VmHWM, reset before the
load) is read after; both are reported above the baseline taken just before the load,
next to the plan's estimate. Also a direct timing against the safetensors copy floor.

    python benchmarks/memory.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from load import (  # noqa: E402
    DEFAULT_CACHE, _reset_peak, _rss, alternating, build_checkpoint, warm_cache,
)

BIG_GROUP = HERE / ".cache" / "big-group-0.8g"
CASES = [("mixtral", "async", 4, False), ("mixtral", "sync", 0, False),
         ("mixtral", "budget", 4, True), ("big-group", "async", 4, False),
         ("big-group", "sync", 0, False), ("big-group", "budget", 4, True)]


def build_big_group(directory: Path) -> None:
    import torch

    sys.path.insert(0, str(HERE.parent))
    from weightplan.demo import write_sharded

    if (directory / "model.safetensors.index.json").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for e in range(64):
        for w, shape in (("w1", (2048, 1024)), ("w3", (2048, 1024)), ("w2", (1024, 2048))):
            tensors[f"layers.0.block_sparse_moe.experts.{e}.{w}.weight"] = torch.randn(
                *shape, generator=g).to(torch.bfloat16)
    write_sharded(tensors, directory, shards=2)


def make_model(case: str, directory: Path):
    import torch

    import weightplan

    if case == "mixtral":
        from transformers import MixtralConfig, MixtralForCausalLM

        with weightplan.init_empty():
            return MixtralForCausalLM(MixtralConfig.from_pretrained(directory))
    with weightplan.init_empty():
        model = torch.nn.Module()
        experts = torch.nn.Module()
        experts.gate_up_proj = torch.nn.Parameter(torch.empty(64, 4096, 1024))
        experts.down_proj = torch.nn.Parameter(torch.empty(64, 1024, 2048))
        model.layers = torch.nn.ModuleList([torch.nn.Module()])
        model.layers[0].mlp = torch.nn.Module()
        model.layers[0].mlp.experts = experts
    return model


class Sampler(threading.Thread):
    """Samples VmRSS every millisecond; keeps the maximum."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self._done = 0, threading.Event()

    def run(self):
        while not self._done.is_set():
            self.peak = max(self.peak, _rss("VmRSS"))
            time.sleep(0.001)

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak


def child(case: str, threads: int, budgeted: bool, directory: Path) -> dict:
    import torch

    import weightplan

    model = make_model(case, directory)
    model_bytes = sum(p.numel() for p in model.parameters()) * 2  # loaded as bf16
    budget = int(model_bytes * 1.10) if budgeted else None
    baseline = _rss("VmRSS")
    sampler = Sampler()
    _reset_peak()
    sampler.start()
    start = time.perf_counter()
    plan = weightplan.explain(model, directory, mapping="mixtral", dtype=torch.bfloat16,
                              threads=threads, budget=budget)
    report = plan.execute(progress=False)
    seconds = time.perf_counter() - start
    sampled = sampler.stop()
    return {"estimate": plan.peak_bytes, "hwm": _rss("VmHWM") - baseline,
            "sampled": sampled - baseline, "tracked": report.peak_bytes, "seconds": seconds,
            "model_bytes": model_bytes, "budget": budget}


def floor_child(directory: Path) -> dict:
    from safetensors.torch import load_file

    start = time.perf_counter()
    held = [{k: t.clone() for k, t in load_file(str(s)).items()}
            for s in sorted(directory.glob("*.safetensors"))]
    return {"seconds": time.perf_counter() - start, "n": len(held)}


def run(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True,
                         text=True, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--floor", help=argparse.SUPPRESS)
    args = parser.parse_args()
    dirs = {"mixtral": DEFAULT_CACHE, "big-group": BIG_GROUP}
    if args.child:
        case, threads, budgeted = args.child
        print(json.dumps(child(case, int(threads), budgeted == "1", dirs[case])))
        return
    if args.floor:
        print(json.dumps(floor_child(dirs[args.floor])))
        return
    build_checkpoint(DEFAULT_CACHE)
    build_big_group(BIG_GROUP)
    for d in dirs.values():
        warm_cache(d)
    report(measure(args.repeat))


def measure(repeat: int) -> dict:
    floors = [(case, "floor", 0, False) for case in ("mixtral", "big-group")]

    def one(contender: tuple) -> dict:
        case, label, threads, budgeted = contender
        if label == "floor":
            return run(["--floor", case])
        return run(["--child", case, str(threads), "1" if budgeted else "0"])

    results = alternating(CASES + floors, repeat, one)
    return {(case, label): rows for (case, label, _, _), rows in results.items()}


def report(results: dict) -> None:
    mib = 1024**2
    print(f"{'case':<11}{'mode':<8}{'estimate':>10}{'VmHWM':>9}{'sampled':>9}{'HWM/est':>9}"
          f"{'HWM/model':>10}{'load s':>8}  (MiB above baseline; medians)")
    for (case, label), rows in results.items():
        if label == "floor":
            continue
        med = {k: statistics.median(r[k] for r in rows) for k in
               ("estimate", "hwm", "sampled", "seconds", "model_bytes")}
        print(f"{case:<11}{label:<8}{med['estimate'] / mib:>10.1f}{med['hwm'] / mib:>9.1f}"
              f"{med['sampled'] / mib:>9.1f}{med['hwm'] / med['estimate']:>9.3f}"
              f"{med['hwm'] / med['model_bytes']:>10.3f}{med['seconds']:>8.3f}"
              + (f"  budget {rows[0]['budget'] / mib:.0f}" if rows[0]["budget"] else ""))
    for case in ("mixtral", "big-group"):
        floor = statistics.median(r["seconds"] for r in results[(case, "floor")])
        free = statistics.median(r["seconds"] for r in results[(case, "async")])
        budget = statistics.median(r["seconds"] for r in results[(case, "budget")])
        print(f"{case}: load / floor {free / floor:.3f} (floor {floor:.3f} s); "
              f"budgeted / unbudgeted time {budget / free:.3f}")


if __name__ == "__main__":
    main()
