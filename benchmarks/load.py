"""Load benchmark: weightplan vs the safetensors copy floor vs transformers from_pretrained.

Builds (or reuses) a ~1.5 GB Mixtral-style checkpoint in the legacy per-expert layout
(8 layers, 8 experts, hidden 1024, intermediate 3584, bf16; written the way
``save_pretrained`` writes Mixtral) and times, each in a fresh process with a warm page
cache, alternating the order of the contenders:

* floor        ``safetensors.torch.load_file`` on every shard, each tensor cloned into
               fresh memory (``load_file`` alone only maps the file)
* weightplan   ``explain`` + ``execute`` into ``MixtralForCausalLM`` built under ``init_empty``
* user         the user path, all of it timed: build ``MixtralForCausalLM(config)`` under
               ``init_empty`` + ``explain(dtype="auto")`` + ``execute`` (build, explain and
               load reported separately)
* transformers ``MixtralForCausalLM.from_pretrained(dtype=bfloat16)``
* pread        a plain parallel ``pread`` of every shard into fresh memory (``--threads``
               workers, 32 MiB requests): the device floor a cold load is held to
* runai        Run:ai Model Streamer (``RUNAI_STREAMER_CONCURRENCY=8``), tensors owned
* fastsafetensors  ``fastsafe_open(nogds=True, device="cpu")``, each tensor cloned

``runai`` and ``fastsafetensors`` are benchmark-only dependencies (``pip install
.[bench]``); a contender whose package is missing is skipped with a note. ``--cold``
evicts the shards from the page cache (``POSIX_FADV_DONTNEED``) before every run instead
of warming it once; on a shared machine, compare only ratios taken in the same run.

Times are the load phase (imports and, for ``weightplan``, the meta model construction
excluded). Peak RSS is the growth of the process's peak resident set during that phase.
``--cold`` evicts the shards from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``)
before each process. Prints medians and the ratios the issue targets.

    python benchmarks/load.py [--repeat 5] [--cache DIR] [--threads 4] [--cold]
        [--modes pread,weightplan,user,runai,fastsafetensors,floor,transformers]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's weightplan, not an installed one
DEFAULT_CACHE = HERE / ".cache" / "mixtral-legacy-1.5g"
DIMS = dict(vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_hidden_layers=8,
            num_attention_heads=16, num_key_value_heads=4, num_local_experts=8,
            num_experts_per_tok=2, tie_word_embeddings=False)


def build_checkpoint(directory: Path) -> None:
    """Random bf16 tensors under the legacy names, sharded like save_pretrained."""
    import torch
    from transformers import MixtralConfig

    from weightplan.demo import write_sharded

    if (directory / "config.json").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    cfg = MixtralConfig(**DIMS)
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    write_sharded(legacy_mixtral_tensors(cfg, rand), directory, shards=4)
    cfg.save_pretrained(directory)


def legacy_mixtral_tensors(cfg: Any, make: Callable[..., Any]) -> dict[str, Any]:
    """Every tensor of ``cfg``'s Mixtral in the legacy per-expert layout, made by
    ``make(*shape)`` (the keys ``save_pretrained`` writes for Mixtral)."""
    h, i, e = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    tensors = {"model.embed_tokens.weight": make(cfg.vocab_size, h),
               "lm_head.weight": make(cfg.vocab_size, h), "model.norm.weight": make(h)}
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}"
        tensors.update({f"{p}.self_attn.q_proj.weight": make(h, h),
                        f"{p}.self_attn.k_proj.weight": make(kv, h),
                        f"{p}.self_attn.v_proj.weight": make(kv, h),
                        f"{p}.self_attn.o_proj.weight": make(h, h),
                        f"{p}.input_layernorm.weight": make(h),
                        f"{p}.post_attention_layernorm.weight": make(h),
                        f"{p}.block_sparse_moe.gate.weight": make(e, h)})
        for x in range(e):
            q = f"{p}.block_sparse_moe.experts.{x}"
            tensors.update({f"{q}.w1.weight": make(i, h), f"{q}.w2.weight": make(h, i),
                            f"{q}.w3.weight": make(i, h)})
    return tensors


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def child(mode: str, directory: Path, threads: int) -> dict:
    """One measurement, in this (fresh) process."""
    import torch

    shards = sorted(directory.glob("*.safetensors"))
    model = None
    if mode == "user":
        return user_path(directory, threads)
    if mode == "weightplan":
        from transformers import MixtralConfig, MixtralForCausalLM

        import weightplan

        cfg = MixtralConfig.from_pretrained(directory)
        with weightplan.init_empty():  # (the first use of the API imports it: not timed)
            model = MixtralForCausalLM(cfg)
    elif mode == "transformers":
        from transformers import MixtralForCausalLM
    elif mode == "floor":
        from safetensors.torch import load_file
    elif mode in PACKAGES:
        __import__(PACKAGES[mode])  # imports are not part of the load
    baseline = _rss("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    if mode == "floor":
        held = [{k: t.clone() for k, t in load_file(str(s)).items()} for s in shards]
        nbytes = sum(t.nbytes for d in held for t in d.values())
    elif mode in CONTENDERS:
        nbytes = CONTENDERS[mode](shards, threads)
    elif mode == "weightplan":
        plan = weightplan.explain(model, directory, dtype=torch.bfloat16, threads=threads)
        planned = time.perf_counter()
        plan.execute(progress=False)
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    else:
        model = MixtralForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    seconds = time.perf_counter() - start
    result = {"mode": mode, "seconds": seconds, "rss_peak": _rss("VmHWM") - baseline,
              "model_bytes": nbytes}
    if mode == "weightplan":
        result.update(explain_seconds=planned - start, planned_peak=plan.peak_bytes)
    return result


def user_path(directory: Path, threads: int) -> dict:
    """Build empty + explain + load, each part timed, as a user writes it."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from weightplan import explain, init_empty  # imports are not part of the load

    cfg = MixtralConfig.from_pretrained(directory)
    baseline = _rss("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    with init_empty():
        model = MixtralForCausalLM(cfg)
    built = time.perf_counter()
    plan = explain(model, directory, dtype="auto", threads=threads)
    planned = time.perf_counter()
    plan.execute(progress=False)
    done = time.perf_counter()
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"mode": "user", "seconds": done - start, "rss_peak": _rss("VmHWM") - baseline,
            "model_bytes": nbytes, "build_seconds": built - start,
            "explain_seconds": planned - built, "load_seconds": done - planned,
            "planned_peak": plan.peak_bytes}


def pread_floor(shards: list[Path], threads: int) -> int:
    """Every shard's bytes read once into fresh memory by ``threads`` parallel preads."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    piece, jobs = 32 << 20, []
    fds = [os.open(s, os.O_RDONLY) for s in shards]
    for fd in fds:
        size = os.fstat(fd).st_size
        jobs += [(fd, at, min(piece, size - at)) for at in range(0, size, piece)]
    held = torch.empty(sum(n for _, _, n in jobs), dtype=torch.uint8)
    buffer, starts = memoryview(held.numpy()), [0]
    for _, _, n in jobs:
        starts.append(starts[-1] + n)

    def one(i: int) -> None:
        fd, at, n = jobs[i]
        done = 0
        while done < n:
            done += os.preadv(fd, [buffer[starts[i] + done:starts[i] + n]], at + done)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(len(jobs))))
    for fd in fds:
        os.close(fd)
    return held.numel()


def runai_streamer(shards: list[Path], threads: int) -> int:
    from runai_model_streamer import SafetensorsStreamer

    held = {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_files([str(s) for s in shards])
        for name, tensor in streamer.get_tensors():
            held[name] = tensor
    return sum(t.nbytes for t in held.values())


def fast_safetensors(shards: list[Path], threads: int) -> int:
    from fastsafetensors import fastsafe_open

    with fastsafe_open([str(s) for s in shards], nogds=True, device="cpu") as f:
        held = {k: f.get_tensor(k).clone() for k in f.keys()}
    return sum(t.nbytes for t in held.values())


CONTENDERS = {"pread": pread_floor, "runai": runai_streamer,
              "fastsafetensors": fast_safetensors}
PACKAGES = {"runai": "runai_model_streamer", "fastsafetensors": "fastsafetensors",
            "transformers": "transformers"}


def available(mode: str) -> bool:
    import importlib.util

    package = PACKAGES.get(mode)
    if package is None or importlib.util.find_spec(package) is not None:
        return True
    print(f"note: skipping {mode}: {package} is not installed (pip install '.[bench]')")
    return False


def evict_cache(directory: Path) -> None:
    """Drop the shards from the page cache: the next read comes from the disk."""
    from weightplan.executor.reader import evict

    for path in directory.glob("*.safetensors"):
        evict(path)


def run_child(mode: str, directory: Path, threads: int, cold: bool = False) -> dict:
    if cold:
        evict_cache(directory)
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--cache", str(directory),
                          "--threads", str(threads)], check=True, capture_output=True, text=True,
                         env={**os.environ, "TRANSFORMERS_VERBOSITY": "error",
                              "HF_HUB_OFFLINE": "1", "RUNAI_STREAMER_CONCURRENCY": "8"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def alternating(contenders: list, repeat: int, measure) -> dict:
    """``measure(c)`` for every contender, ``repeat`` rounds, reversing the order every
    other round so no contender always runs first; results by contender, in run order."""
    results: dict = {c: [] for c in contenders}
    for r in range(repeat):
        for c in (contenders if r % 2 == 0 else contenders[::-1]):
            results[c].append(measure(c))
    return results


def warm_cache(directory: Path) -> None:
    for path in directory.glob("*.safetensors"):
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--modes", default="floor,weightplan,user,transformers")
    parser.add_argument("--cold", action="store_true",
                        help="evict the shards from the page cache before every run")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.cache, args.threads)))
        return
    build_checkpoint(args.cache)
    if not args.cold:
        warm_cache(args.cache)
    modes = [m for m in args.modes.split(",") if available(m)]
    print(f"page cache: {'cold (evicted before every run)' if args.cold else 'warm'}")
    report(alternating(modes, args.repeat,
                       lambda mode: run_child(mode, args.cache, args.threads, args.cold)))


def medians_table(results: dict[str, list[dict]], title: str
                  ) -> tuple[dict[str, float], dict[str, float], int]:
    """Print each contender's median load time and peak RSS; returns (time, RSS, model
    bytes) medians for the ratios a benchmark prints after it."""
    gib = 1024**3
    med = {m: statistics.median(x["seconds"] for x in rs) for m, rs in results.items()}
    rss = {m: statistics.median(x["rss_peak"] for x in rs) for m, rs in results.items()}
    model_bytes = next(iter(results.values()))[0]["model_bytes"]
    print(f"{title}; medians of {len(next(iter(results.values())))} fresh-process runs")
    print(f"{'contender':<14}{'load s':>9}{'peak RSS GiB':>14}{'RSS / model':>13}")
    for m in results:
        print(f"{m:<14}{med[m]:>9.3f}{rss[m] / gib:>14.3f}{rss[m] / model_bytes:>13.3f}")
    return med, rss, model_bytes


def report(results: dict[str, list[dict]]) -> None:
    gib = 1024**3
    model_bytes = next(iter(results.values()))[0]["model_bytes"]
    med, rss, _ = medians_table(results, f"checkpoint: {model_bytes / gib:.2f} GiB of tensors")
    if "weightplan" in med:
        wp = results["weightplan"]
        explain_s = statistics.median(x["explain_seconds"] for x in wp)
        planned = statistics.median(x["planned_peak"] for x in wp)
        print(f"weightplan explain (headers, plan): {explain_s:.3f} s of the {med['weightplan']:.3f} s;"
              f" planned peak {planned / gib:.3f} GiB vs measured {rss['weightplan'] / gib:.3f} GiB")
        if "floor" in med:
            print(f"weightplan / floor time:        {med['weightplan'] / med['floor']:.3f}  (target ≤ 1.3)")
        if "pread" in med:
            print(f"weightplan / parallel pread:    {med['weightplan'] / med['pread']:.3f}  (target ≤ 1.05 cold)")
        for other in ("runai", "fastsafetensors"):
            if other in med:
                print(f"weightplan / {other + ':':<18}{med['weightplan'] / med[other]:.3f}  (target ≤ 1.0 cold)")
        if "transformers" in med:
            print(f"weightplan / transformers time: {med['weightplan'] / med['transformers']:.3f}  (target ≤ 0.5)")
        print(f"weightplan peak RSS / model:    {rss['weightplan'] / model_bytes:.3f}  (target ≤ 1.10)")
    if "user" in med:
        user_report(results["user"], med, rss["user"] / model_bytes)


def user_report(runs: list[dict], med: dict, rss_ratio: float) -> None:
    parts = {k: statistics.median(x[f"{k}_seconds"] for x in runs)
             for k in ("build", "explain", "load")}
    print(f"user path {med['user']:.3f} s: build {parts['build']:.3f} s, explain "
          f"{parts['explain']:.3f} s, load {parts['load']:.3f} s")
    if "floor" in med:
        print(f"user / floor time:              {med['user'] / med['floor']:.3f}  (target ≤ 1.3)")
    if "transformers" in med:
        print(f"user / transformers time:       {med['user'] / med['transformers']:.3f}  "
              "(target ≤ 0.35 warm, ≤ 0.45 cold)")
    print(f"user peak RSS / model:          {rss_ratio:.3f}  (target ≤ 1.02)")


if __name__ == "__main__":
    main()
