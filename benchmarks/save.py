"""Save benchmark: weightplan.save back to the legacy layout vs safetensors.save_file.

Uses the ~1.5 GB Mixtral-style legacy checkpoint of ``benchmarks/load.py`` (built on first
use). Each measurement runs in a fresh process that first loads the model with weightplan
(bf16, experts fused), then times, with peak RSS growth over the loaded state:

* weightplan    ``weightplan.save(model, out)``: experts split back into per-expert
                ``w1``/``w2``/``w3`` under ``block_sparse_moe``, written atomically, fsync'ed
* reference     ``safetensors.torch.save_file`` of an already-converted dict of the same
                bytes (the legacy tensors, cloned before timing), plus an fsync so both
                reach the disk

Targets: time ≤ 1.3× the reference; peak RSS ≤ model + largest converter group + 10%.

    python benchmarks/save.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from load import (  # noqa: E402
    DEFAULT_CACHE, _reset_peak, _rss, alternating, build_checkpoint, warm_cache,
)


def child(mode: str, directory: Path, out: Path) -> dict:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import MixtralConfig, MixtralForCausalLM

    import weightplan

    cfg = MixtralConfig.from_pretrained(directory)
    with weightplan.init_empty():
        model = MixtralForCausalLM(cfg)
    plan = weightplan.explain(model, directory, dtype=torch.bfloat16)
    plan.execute(progress=False)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    largest_group = max(p.dest_bytes for p in plan.schedule.steps)
    legacy = None
    if mode == "reference":
        legacy = {}
        for shard in sorted(directory.glob("*.safetensors")):
            legacy.update({k: v.clone() for k, v in load_file(str(shard)).items()})
    baseline = _rss("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    if mode == "weightplan":
        weightplan.save(model, out, progress=False)
    else:
        out.mkdir(parents=True, exist_ok=True)
        path = out / "model.safetensors"
        save_file(legacy, str(path), metadata={"format": "pt"})
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    seconds = time.perf_counter() - start
    written = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    return {"mode": mode, "seconds": seconds, "rss_peak": _rss("VmHWM") - baseline,
            "model_bytes": model_bytes, "largest_group": largest_group, "written": written}


def run_child(mode: str, directory: Path) -> dict:
    # (next to the checkpoint: the same disk as the source, whatever --cache says)
    with tempfile.TemporaryDirectory(dir=directory.parent) as tmp:
        out = Path(tmp) / "out"
        proc = subprocess.run([sys.executable, __file__, "--child", mode, "--cache",
                               str(directory), "--out", str(out)], check=True,
                              capture_output=True, text=True,
                              env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
        shutil.rmtree(out, ignore_errors=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.cache, args.out)))
        return
    build_checkpoint(args.cache)
    warm_cache(args.cache)
    report(alternating(["reference", "weightplan"], args.repeat,
                       lambda mode: run_child(mode, args.cache)))


def report(results: dict[str, list[dict]]) -> None:
    gib = 1024**3
    med = {m: statistics.median(x["seconds"] for x in rs) for m, rs in results.items()}
    rss = {m: statistics.median(x["rss_peak"] for x in rs) for m, rs in results.items()}
    first = results["weightplan"][0]
    model, group = first["model_bytes"], first["largest_group"]
    print(f"model {model / gib:.2f} GiB (resident before saving), largest converter group "
          f"{group / gib:.3f} GiB; medians of {len(results['weightplan'])} fresh-process runs")
    print(f"{'contender':<12}{'save s':>9}{'RSS growth GiB':>16}{'written GiB':>13}")
    for m in results:
        print(f"{m:<12}{med[m]:>9.3f}{rss[m] / gib:>16.3f}"
              f"{results[m][0]['written'] / gib:>13.3f}")
    print(f"weightplan / reference time: {med['weightplan'] / med['reference']:.3f}  (target ≤ 1.3)")
    bound = 0.10 * model + group
    print(f"weightplan peak RSS above the loaded model: {rss['weightplan'] / gib:.3f} GiB; "
          f"allowed largest group + 10% of the model = {bound / gib:.3f} GiB")


if __name__ == "__main__":
    main()
