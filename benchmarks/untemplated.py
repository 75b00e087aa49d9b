"""Per-key cost of planning an *un-templated* header: keys that share no template.

A frontier checkpoint's keys follow a few dozen templates (``layers.{i}.mlp.experts.{j}…``),
so routing is decided once per template. A hostile (or just unusual) header of random
names gives every key its own template: this measures what such a key costs ``explain()``,
per key, without a model (``explain(None, ckpt)``) and with a meta model whose parameters
carry the checkpoint's names and specs (``explain(model, ckpt)``).

The fixture is one header-only safetensors file (its header written, then ``os.truncate``d
to full size) of N keys: three random words of ``[a-z0-9]`` joined by dots, small shapes,
mixed dtypes (BF16, F16, F32). Printed per key: CPU µs (``time.process_time``, medians)
and the Python heap the plan holds (tracemalloc, a separate run), each against issue 21's
targets (≤ 10 µs, ≤ 1 KB per key), and the same figures for DeepSeek-V3 FP8 (91,991
templated keys, its model on meta) for comparison.

    python benchmarks/untemplated.py [--keys 20000 100000] [--repeat 3] [--no-model]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import struct
import sys
import time
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

TARGET_US, TARGET_BYTES = 10.0, 1024.0  # issue 21, item 12: per un-templated key
_DTYPES = (("BF16", 2), ("F16", 2), ("F32", 4))
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def random_entries(n: int, seed: int = 0) -> list[tuple[str, str, tuple[int, ...]]]:
    """``n`` distinct keys ``word.word.word`` (no two share a template), a dtype, a shape."""
    rng = random.Random(seed)
    seen: set[str] = set()
    entries = []
    while len(entries) < n:
        key = ".".join("".join(rng.choices(_ALPHABET, k=rng.randint(4, 8))) for _ in range(3))
        if key in seen:
            continue
        seen.add(key)
        shape = tuple(rng.randint(1, 64) for _ in range(rng.randint(1, 2)))
        entries.append((key, rng.choice(_DTYPES)[0], shape))
    return entries


def write_header_only(path: Path, entries: list[tuple[str, str, tuple[int, ...]]]) -> None:
    itemsize = dict(_DTYPES)
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, dtype, shape in entries:
        size = itemsize[dtype]
        for d in shape:
            size *= d
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
    os.truncate(path, 8 + len(raw) + offset)


def fixture(cache: Path, n: int) -> tuple[Path, list]:
    path = cache / f"untemplated-{n}" / "model.safetensors"
    entries = random_entries(n)
    if not path.exists():
        write_header_only(path, entries)
    return path, entries


def meta_model(entries):
    """A module tree on meta whose parameters are exactly the entries (names, shapes, dtypes)."""
    import torch

    torch_dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    root = torch.nn.Module()
    for key, dtype, shape in entries:
        *path, leaf = key.split(".")
        module = root
        for part in path:  # (built through the dicts: setattr would cost minutes at 1M)
            child = module._modules.get(part)
            if child is None:
                child = module._modules[part] = torch.nn.Module()
            module = child
        module._parameters[leaf] = torch.nn.Parameter(
            torch.empty(shape, dtype=torch_dtype[dtype], device="meta"), requires_grad=False)
    return root


def cpu_per_key(model, path, repeat: int, **kwargs) -> tuple[float, int]:
    import weightplan

    cpu, plan = [], None
    for _ in range(repeat):
        plan = None  # the previous plan is freed outside the timing
        gc.collect()
        start = time.process_time()
        plan = weightplan.explain(model, path, **kwargs)
        cpu.append(time.process_time() - start)
    assert plan is not None
    keys = len(plan.checkpoint)
    return 1e6 * statistics.median(cpu) / keys, keys


def heap_per_key(model, path, **kwargs) -> float:
    import weightplan

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    plan = weightplan.explain(model, path, **kwargs)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / len(plan.checkpoint)


def row(label: str, us: float, heap: float) -> None:
    print(f"  {label:<34}{us:>8.1f} µs ({us / TARGET_US:>5.2f}× target)"
          f"{heap:>8.0f} B ({heap / TARGET_BYTES:>5.2f}× target)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=HERE / ".cache" / "untemplated")
    parser.add_argument("--frontier-cache", type=Path, default=HERE / ".cache" / "frontier")
    parser.add_argument("--keys", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-model", action="store_true", help="skip explain(model, ckpt)")
    parser.add_argument("--no-frontier", action="store_true", help="skip DeepSeek-V3 FP8")
    args = parser.parse_args()
    print(f"per key: CPU µs (median of {args.repeat}) and plan heap; targets "
          f"≤ {TARGET_US:.0f} µs, ≤ {TARGET_BYTES:.0f} B")
    for n in args.keys:
        path, entries = fixture(args.cache, n)
        print(f"un-templated, {n:,} keys:")
        us, _ = cpu_per_key(None, path, args.repeat)
        row("explain(None, ckpt)", us, heap_per_key(None, path))
        if not args.no_model:
            model = meta_model(entries)
            us, _ = cpu_per_key(model, path, args.repeat)
            row("explain(model, ckpt)", us, heap_per_key(model, path))
            del model
    if not args.no_frontier:
        import torch

        from benchmarks.plan import fixture as frontier_fixture
        from benchmarks.plan import meta_model as frontier_model

        directory = frontier_fixture(args.frontier_cache, "deepseek-v3-fp8")
        model = frontier_model(directory)
        us, keys = cpu_per_key(model, directory, args.repeat, dtype=torch.bfloat16)
        print(f"deepseek-v3-fp8 (templated), {keys:,} keys:")
        row("explain(model, ckpt)", us, heap_per_key(model, directory, dtype=torch.bfloat16))


if __name__ == "__main__":
    main()
