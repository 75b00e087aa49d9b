"""Device benchmark: automatic placement, disk offload, and the GPU path.

Planning parts (run everywhere, CI included):

* *auto map*: ``device_map="auto"`` placed for a 100-layer model (``--layers``) over eight
  80 GiB GPUs named in ``max_memory`` (a dry run: none needs to exist), the placement step
  alone, median of ``--repeat`` — beside accelerate's ``get_balanced_memory`` +
  ``infer_auto_device_map`` on the same meta model, measured in the same run. Target
  (issue 24): ≤ 50 ms.
* *disk offload*: a 606 MB Llama checkpoint (offloaded tensors referenced in place) and a
  ~300 MB Mixtral one (offloaded experts merged, so written), each loaded with a part
  offloaded to the disk (``max_memory={"cpu": ...}``, ``offload_folder``) vs the same load
  onto the CPU, fresh processes, alternating, medians; warm (page cache) and cold (the
  checkpoint's pages dropped with ``posix_fadvise(DONTNEED)``). Target: ≤ 1.2×.

GPU parts (only with a CUDA device; without one this says so and exits 0): on a ~20 GB
Mixtral-style checkpoint (``--gpu-layers`` layers of Mixtral-8x7B's shapes, bf16, written
once into ``--cache``), each in a fresh process, warm and cold (the shards evicted from
the page cache first):

* weightplan   ``explain(model, d, device="cuda:0")`` + ``execute``
* transformers ``from_pretrained(d, device_map="cuda:0")``
* floor        the pinned host→device copy floor: the checkpoint's bytes copied from
               pinned buffers to the GPU (``cudaMemcpyAsync``), in 256 MiB chunks

and, in this process, FP8 → bf16 of block-quantized weights (e4m3, 128×128 scales):
dequantized on the host then copied, vs the FP8 bytes and scales copied and dequantized on
the GPU (half the bytes over the bus). Ratios printed: warm load / floor bandwidth, cold
load / transformers, device / host dequantize. The Run:ai streamer and fastsafetensors
contenders live in ``benchmarks/load.py`` (CPU destinations).

    python benchmarks/device.py [--repeat 5] [--layers 100] [--cache DIR] [--gpu-layers 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's weightplan, not an installed one
DEFAULT_CACHE = HERE / ".cache" / "mixtral-20g"
MIXTRAL = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
               num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
               num_experts_per_tok=2, tie_word_embeddings=False)
GPU_BUDGET = "80GiB"


def tiny_llama(layers: int, hidden: int = 64):
    """A ``layers``-deep Llama config (small tensors: planning cost is per module)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4,
                       num_key_value_heads=2, tie_word_embeddings=False)


def tiny_mixtral(layers: int, hidden: int = 512):
    """A Mixtral config whose experts (saved one tensor per expert) the load merges: the
    offloaded ones are converted, so written to ``offload_folder``."""
    from transformers import MixtralConfig

    return MixtralConfig(vocab_size=256, hidden_size=hidden, intermediate_size=768,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False)


def save_model(cfg, directory: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(directory)


def auto_map_times(layers: int, repeat: int) -> dict:
    """The placement step of ``device_map="auto"`` vs accelerate's, same meta model."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory
    from transformers import LlamaForCausalLM

    import weightplan
    from weightplan.planner.pipelines.devices import automatic_request

    cfg = tiny_llama(layers)
    with tempfile.TemporaryDirectory() as d:
        save_model(cfg, Path(d))
        with weightplan.init_empty():
            model = LlamaForCausalLM(cfg)
        plan = weightplan.explain(model, d)
        gpus = {f"cuda:{i}": max(plan.model_bytes // 6, 1) for i in range(8)}
        max_memory = {**gpus, "cpu": "200GiB"}
        request = automatic_request("auto", max_memory, None, model, None)
        assert request is not None
        ours, theirs = [], []
        words = {i: b for i, b in enumerate(gpus.values())} | {"cpu": 200 << 30}
        for _ in range(repeat):
            start = time.process_time()
            options, _ = request.placed(plan.options, model, plan.model_info, plan.schedule)
            ours.append(time.process_time() - start)
            start = time.process_time()
            balanced = get_balanced_memory(model, max_memory=dict(words),
                                           no_split_module_classes=model._no_split_modules)
            infer_auto_device_map(model, max_memory=balanced,
                                  no_split_module_classes=model._no_split_modules)
            theirs.append(time.process_time() - start)
        assert options.placement is not None
        used = sorted({d for _, d in options.placement.device_map})
    return {"ours": statistics.median(ours), "accelerate": statistics.median(theirs),
            "devices": used}


def offload_child(mode: str, directory: Path, budget: int, folder: str) -> dict:
    """One load, in this (fresh) process: onto the CPU, or half offloaded to the disk."""
    from transformers import AutoConfig, AutoModelForCausalLM

    import weightplan

    with weightplan.init_empty():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    start, cpu = time.perf_counter(), time.process_time()
    if mode == "cpu":
        plan = weightplan.explain(model, directory)
    else:
        plan = weightplan.explain(model, directory, device_map="auto",
                                  max_memory={"cpu": budget}, offload_folder=folder)
    plan.execute(progress=False)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    on_disk = sum(1 for _, d in (plan.device_map or {}).items() if d == "disk")
    offload = plan.options.placement.offload if plan.options.placement is not None else None
    written = offload.written_bytes if offload is not None else 0
    return {"mode": mode, "seconds": seconds, "cpu": cpu, "disk_entries": on_disk,
            "written": written}


def offload_times(cfg, repeat: int) -> dict:
    """Plain load vs half offloaded, fresh processes, alternating; warm (the checkpoint in
    the page cache) and cold (its pages dropped with ``posix_fadvise(DONTNEED)`` first)."""
    results: dict[str, list[float]] = {f"{m} {c}{t}": [] for m in ("cpu", "disk")
                                       for c in ("warm", "cold") for t in ("", " cpu")}
    from weightplan.executor.reader import evict

    entries = written = 0
    with tempfile.TemporaryDirectory() as d:
        save_model(cfg, Path(d))
        shards = sorted(Path(d).glob("*.safetensors"))
        size = sum(p.stat().st_size for p in shards)
        for r in range(repeat):
            for mode in (("cpu", "disk") if r % 2 == 0 else ("disk", "cpu")):
                for cache in ("warm", "cold"):
                    if cache == "cold":
                        for shard in shards:  # (the library's own evict, as load.py uses)
                            evict(shard)
                    folder = tempfile.mkdtemp(dir=d)
                    out = run([sys.executable, __file__, "--child", mode, "--cache", d,
                               "--budget", str(size * 3 // 4), "--folder", folder])
                    results[f"{mode} {cache}"].append(out["seconds"])
                    results[f"{mode} {cache} cpu"].append(out["cpu"])  # (process CPU time)
                    entries = max(entries, out["disk_entries"])
                    written = max(written, out["written"])
    return {"bytes": size, **{m: statistics.median(v) for m, v in results.items()},
            "disk_entries": entries, "written": written}


def run(argv: list[str]) -> dict:
    out = subprocess.run(argv, check=True, capture_output=True, text=True,
                         env={**os.environ, "TRANSFORMERS_VERBOSITY": "error",
                              "HF_HUB_OFFLINE": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def planning(args: argparse.Namespace) -> None:
    times = auto_map_times(args.layers, args.repeat)
    print(f"auto map, {args.layers}-layer model over 8 GPUs (dry run; "
          f"{', '.join(times['devices'])} used): {times['ours'] * 1e3:.1f} ms CPU "
          f"(target ≤ 50 ms); accelerate get_balanced_memory + infer_auto_device_map "
          f"{times['accelerate'] * 1e3:.1f} ms (ratio {times['ours'] / times['accelerate']:.2f})")
    for name, cfg in (("llama", tiny_llama(16, hidden=1024)), ("mixtral", tiny_mixtral(8))):
        off = offload_times(cfg, max(3, args.repeat // 2))
        for cache in ("warm", "cold"):
            disk, cpu = off[f"disk {cache}"], off[f"cpu {cache}"]
            print(f"disk offload, {name}, {cache} ({off['bytes'] / 1e6:.0f} MB, "
                  f"{off['disk_entries']} map entries on disk, {off['written'] / 1e6:.0f} MB "
                  f"of it written): {disk:.3f} s vs plain load {cpu:.3f} s (ratio "
                  f"{disk / cpu:.2f}, target ≤ 1.2; CPU time ratio "
                  f"{off[f'disk {cache} cpu'] / off[f'cpu {cache} cpu']:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--layers", type=int, default=100)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--gpu-layers", type=int, default=7)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child in ("cpu", "disk"):
        print(json.dumps(offload_child(args.child, args.cache, args.budget, args.folder)))
        return
    if args.child is not None:
        from gpu_device import gpu_child  # (a GPU measurement, in a fresh process)

        print(json.dumps(gpu_child(args.child, args.cache)))
        return
    planning(args)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device available: the GPU measurements (weightplan → cuda:0, "
              "transformers device_map='cuda:0', the pinned copy floor, FP8 dequantize on "
              "the device vs the host) were skipped")
        return
    from gpu_device import gpu_benchmark

    gpu_benchmark(args)


if __name__ == "__main__":
    main()
