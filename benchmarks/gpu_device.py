"""The GPU half of ``benchmarks/device.py`` (see its docstring): only imported with CUDA."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

CHUNK = 256 << 20  # bytes per pinned buffer of the copy floor
FP8_SHAPE, FP8_COUNT, BLOCK = (4096, 14336), 16, 128  # ~0.9 GB of FP8 weights


def build_checkpoint(directory: Path, layers: int) -> None:
    """Mixtral-8x7B shapes, ``layers`` deep, bf16, in the per-expert layout (~2.8 GB a
    layer); constant values (the reads, not the numbers, are measured)."""
    from transformers import MixtralConfig

    from device import MIXTRAL
    from load import legacy_mixtral_tensors
    from weightplan.demo import write_sharded

    if (directory / "config.json").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    cfg = MixtralConfig(**MIXTRAL, num_hidden_layers=layers)

    def full(*shape: int) -> torch.Tensor:
        return torch.full(shape, 0.01, dtype=torch.bfloat16)

    write_sharded(legacy_mixtral_tensors(cfg, full), directory, shards=4 * layers)
    cfg.save_pretrained(directory)


def gpu_child(mode: str, directory: Path) -> dict:
    """One measurement in this (fresh) process; the model is freed before returning."""
    from transformers import MixtralConfig, MixtralForCausalLM

    import weightplan

    shards = sorted(directory.glob("*.safetensors"))
    nbytes = sum(p.stat().st_size for p in shards)
    torch.cuda.init()
    torch.empty(1, device="cuda:0")  # the context exists before the clock starts
    if mode == "floor":
        return {"mode": mode, "seconds": pinned_floor(nbytes), "bytes": nbytes}
    model = None
    if mode == "weightplan":
        with weightplan.init_empty():
            model = MixtralForCausalLM(MixtralConfig.from_pretrained(directory))
    torch.cuda.synchronize()
    start = time.perf_counter()
    if mode == "weightplan":
        plan = weightplan.explain(model, directory, dtype=torch.bfloat16, device="cuda:0")
        plan.execute(progress=False)
    else:
        model = MixtralForCausalLM.from_pretrained(directory, dtype=torch.bfloat16,
                                                   device_map="cuda:0")
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    assert model is not None and next(model.parameters()).device.type == "cuda"
    return {"mode": mode, "seconds": seconds, "bytes": nbytes,
            "device_bytes": torch.cuda.max_memory_allocated(0)}


def pinned_floor(nbytes: int) -> float:
    """Seconds to copy ``nbytes`` from pinned host buffers to the GPU, two buffers in turn
    (the copy engine never waits for the host)."""
    buffers = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    target = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for n, at in enumerate(range(0, nbytes, CHUNK)):
        size = min(CHUNK, nbytes - at)
        target[at:at + size].copy_(buffers[n % 2][:size], non_blocking=True)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def dequantize(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Block FP8 → bf16: each 128×128 tile times its scale (transformers' fine-grained
    formula), on ``weight``'s device."""
    rows, cols = weight.shape
    expanded = scale.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return (weight.to(torch.float32) * expanded).to(torch.bfloat16)


def fp8_times(repeat: int) -> dict:
    """Host dequantize + copy vs copy + device dequantize, the same FP8 weights."""
    rows, cols = FP8_SHAPE
    weights = [(torch.randn(rows, cols) * 0.1).to(torch.float8_e4m3fn).pin_memory()
               for _ in range(FP8_COUNT)]
    scales = [torch.rand(-(-rows // BLOCK), -(-cols // BLOCK)).pin_memory() for _ in weights]
    host, device = [], []
    for _ in range(repeat):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for w, s in zip(weights, scales, strict=True):
            dequantize(w, s).to("cuda:0", non_blocking=False)
        torch.cuda.synchronize()
        host.append(time.perf_counter() - start)
        start = time.perf_counter()
        for w, s in zip(weights, scales, strict=True):
            dequantize(w.to("cuda:0", non_blocking=True), s.to("cuda:0", non_blocking=True))
        torch.cuda.synchronize()
        device.append(time.perf_counter() - start)
    return {"host": statistics.median(host), "device": statistics.median(device)}


def child_run(mode: str, directory: Path, cold: bool) -> dict:
    if cold:
        from weightplan.executor.reader import evict

        for path in directory.glob("*.safetensors"):
            evict(path)
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("device.py")),
                          "--child", mode, "--cache", str(directory)], check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "TRANSFORMERS_VERBOSITY": "error",
                              "HF_HUB_OFFLINE": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def gpu_benchmark(args: argparse.Namespace) -> None:
    build_checkpoint(args.cache, args.gpu_layers)
    modes = ["floor", "weightplan", "transformers"]
    results: dict[tuple[str, bool], list[float]] = {}
    nbytes = 0
    for cold in (False, True):
        for r in range(max(1, args.repeat // 2)):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                if cold and mode == "floor":
                    continue  # (the floor copies from memory: no file is read)
                out = child_run(mode, args.cache, cold)
                nbytes = out["bytes"]
                results.setdefault((mode, cold), []).append(out["seconds"])
    med = {k: statistics.median(v) for k, v in results.items()}
    for (mode, cold), seconds in sorted(med.items()):
        print(f"{mode:13s} {'cold' if cold else 'warm'}  {seconds:7.2f} s  "
              f"{nbytes / seconds / 1e9:6.2f} GB/s")
    floor = med[("floor", False)]
    print(f"warm: weightplan at {floor / med[('weightplan', False)]:.0%} of the pinned copy "
          f"floor's bandwidth (target ≥ 90%); "
          f"{med[('weightplan', False)] / med[('transformers', False)]:.2f}× transformers")
    print(f"cold: weightplan {med[('weightplan', True)] / med[('transformers', True)]:.2f}× "
          "transformers (target ≤ 0.5)")
    fp8 = fp8_times(args.repeat)
    print(f"FP8 → bf16 ({FP8_COUNT} × {FP8_SHAPE}): host dequantize + copy {fp8['host']:.3f} s,"
          f" copy + device dequantize {fp8['device']:.3f} s (ratio "
          f"{fp8['device'] / fp8['host']:.2f}, target ≤ 0.6)")
