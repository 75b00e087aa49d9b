"""Adapter benchmark (issue 23): a Mixtral-style base plus a per-expert LoRA adapter on every
expert, loaded by weightplan in one plan (``from_pretrained(BASE, adapter=DIR)``) beside the
reference measured in the same run: transformers' ``from_pretrained`` then peft's
``PeftModel.from_pretrained`` (which converts the per-expert adapter to the fused layout);
and merged (``merge=True``) beside weightplan's plain load of the base.

Each contender runs in a fresh process, alternated (reference, weightplan, merged, plain,
reference, ...); medians of ``--repeat`` are printed with the ratios and the issue's
targets: wall ≤ 0.5× the reference, peak RSS added by the load ≤ 1.05× the bytes the loaded
model holds (base and adapter, the adapter in float32 as peft keeps it), merge=True ≤ 1.3×
the plain load's wall. Beside them, the floor of that last target on this machine: the
same merges in plain torch (``floor``: each adapted weight widened to float32 a block of rows
at a time, ``B @ A`` into a reused buffer, times ``s``, added, rounded once; one thread,
the tensors already in memory), as a fraction of the plain load: where the plain load keeps
every core busy, merged ≥ plain + floor / cores. RSS is the high-water mark when the load
returns (a forward pass after it, the same for every contender, is not the load's). The adapted logits must equal
the reference's (merged: one merged weight equals W + s·B·A rounded once), else the numbers
are refused.

    python benchmarks/adapters.py [--gb 1.5] [--rank 16] [--repeat 3] [--dir DIR]
    python benchmarks/adapters.py --gb 0.3 --repeat 1   # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = """
import json, sys, time, torch
import transformers, peft, weightplan
torch.manual_seed(0)
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
before, wall = hwm(), time.perf_counter()
base, adapter, which = sys.argv[1:4]
if which == "reference":
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    model = peft.PeftModel.from_pretrained(model, adapter)
elif which == "plain":
    model = weightplan.from_pretrained(base, dtype=torch.bfloat16)
else:
    model = weightplan.from_pretrained(base, adapter=adapter, dtype=torch.bfloat16,
                                       merge=which == "merged")
seconds, rss = time.perf_counter() - wall, hwm() - before
held = sum(t.numel() * t.element_size() for t in model.state_dict().values())
exact = None
if which == "merged":  # layer 0, expert 0's w1 rows: W + s·B·A in float32, rounded once
    from safetensors import safe_open
    key = "model.layers.0.block_sparse_moe.experts.0.w1"
    with safe_open(f"{base}/model.safetensors", "pt") as f:
        w = f.get_tensor(f"{key}.weight")
    with safe_open(f"{adapter}/adapter_model.safetensors", "pt") as f:
        a, b = (f.get_tensor(f"base_model.model.{key}.lora_{x}.weight") for x in "AB")
    want = (w.float() + (b @ a) * 2.0).to(w.dtype)
    exact = torch.equal(model.model.layers[0].mlp.experts.gate_up_proj[0, :w.shape[0]], want)
with torch.no_grad():
    logits = model(torch.arange(16)[None]).logits.float()
print(json.dumps({"seconds": seconds, "rss": rss, "held": held, "exact": exact,
                  "logits": logits[0, -1, :8].tolist()}))
"""

FLOOR = """
import json, sys, time, torch
from safetensors import safe_open
torch.set_num_threads(1)
base, adapter, rows = sys.argv[1], sys.argv[2], 128
config = json.load(open(f"{adapter}/adapter_config.json"))
s = config["lora_alpha"] / config["r"]
with safe_open(f"{adapter}/adapter_model.safetensors", "pt") as f:
    lora = {k[len("base_model.model."):]: f.get_tensor(k).float() for k in f.keys()}
with safe_open(f"{base}/model.safetensors", "pt") as f:
    jobs = [(f.get_tensor(k).clone(), lora[k.replace(".weight", ".lora_A.weight")],
             lora[k.replace(".weight", ".lora_B.weight")]) for k in f.keys()
            if k.replace(".weight", ".lora_A.weight") in lora]
width = max(w.shape[1] for w, _, _ in jobs)
delta, wide = torch.empty(rows * width), torch.empty(rows * width)
want = (jobs[0][0].float() + (jobs[0][2] @ jobs[0][1]) * s).to(jobs[0][0].dtype)
start = time.perf_counter()
for w, a, b in jobs:  # (rows a multiple of 16 and dividing every weight: as B @ A sums)
    for i in range(0, len(w), rows):
        block = w[i:i + rows]
        d, x = delta[:block.numel()].view(block.shape), wide[:block.numel()].view(block.shape)
        torch.mm(b[i:i + rows], a, out=d)
        x.copy_(block)
        x.add_(d.mul_(s))
        block.copy_(x)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "exact": torch.equal(jobs[0][0], want)}))
"""


def build(directory: Path, gb: float, rank: int) -> int:
    """A bf16 Mixtral-style base of about ``gb`` GB and a per-expert adapter; its bytes."""
    import torch
    from transformers import AutoModelForCausalLM, MixtralConfig

    sys.path.insert(0, str(ROOT))
    from tests.adapters.builders import MIXTRAL, per_expert_adapter

    hidden, inter, experts = 1024, 1536, 8
    per_layer = experts * 3 * hidden * inter * 2
    layers = max(1, round(gb * 1e9 / per_layer))
    config = MixtralConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=inter,
                           num_hidden_layers=layers, num_attention_heads=8,
                           num_key_value_heads=2, num_local_experts=experts,
                           num_experts_per_tok=2)
    if not (directory / "base" / "config.json").exists():
        model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
        model.save_pretrained(directory / "base")
        per_expert_adapter(str(directory / "adapter"), MIXTRAL, experts=experts,
                           hidden=hidden, inter=inter, layers=layers, r=rank, alpha=2 * rank,
                           attention=True)
    return sum(f.stat().st_size for f in (directory / "base").glob("*.safetensors"))


def run(directory: Path, which: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", FLOOR if which == "floor" else RUN,
                           str(directory / "base"),
                           str(directory / "adapter"), which], capture_output=True,
                          text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", "--size", type=float, default=1.5, help="base size in GB")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="wp-adapters-"))
    model_bytes = build(directory, args.gb, args.rank)
    results: dict[str, list[dict]] = {"reference": [], "weightplan": [], "merged": [],
                                      "plain": [], "floor": []}
    for _ in range(args.repeat):
        for which in results:
            results[which].append(run(directory, which))
    _check_logits(results)
    wall = {k: statistics.median(r["seconds"] for r in v) for k, v in results.items()}
    floor = wall.pop("floor")
    del results["floor"]
    rss = {k: statistics.median(r["rss"] for r in v) for k, v in results.items()}
    held = {k: v[0]["held"] for k, v in results.items()}
    print(f"base {model_bytes / 1e9:.2f} GB, adapter rank {args.rank} on every expert, "
          f"medians of {args.repeat}")
    for k in results:
        print(f"  {k:>10}: wall {wall[k]:.2f} s, peak RSS added {rss[k] / 1e9:.2f} GB "
              f"({rss[k] / held[k]:.2f}× the {held[k] / 1e9:.2f} GB the model holds)")
    print(f"  wall ratio weightplan/reference: {wall['weightplan'] / wall['reference']:.2f} "
          "(target ≤ 0.5)")
    print(f"  weightplan peak RSS / model bytes: {rss['weightplan'] / held['weightplan']:.2f} "
          "(target ≤ 1.05)")
    print(f"  wall ratio merged/plain load: {wall['merged'] / wall['plain']:.2f} "
          "(target ≤ 1.3); merged peak RSS / model bytes: "
          f"{rss['merged'] / held['merged']:.2f}")
    print(f"  floor: the merges alone in plain torch, one thread: {floor:.2f} s = "
          f"{floor / wall['plain']:.2f}× the plain load (where the plain load keeps every "
          f"core busy, merged/plain ≥ {1 + floor / wall['plain'] / (os.cpu_count() or 1):.2f})")


def _check_logits(results: dict[str, list[dict]]) -> None:
    if not all(r["exact"] for r in results["floor"]):
        raise SystemExit("the floor's merged weight is not W + s·B·A rounded once")
    ref = results["reference"][0]["logits"]
    if results["weightplan"][0]["logits"] != ref:
        raise SystemExit(f"the adapted logits differ: {ref} vs {results['weightplan'][0]}")
    if not results["merged"][0]["exact"]:  # (logits: random deltas this large amplify
        # the one rounding of a merged weight through the layers, so the weights are checked)
        raise SystemExit("the merged weights are not W + s·B·A rounded once")


if __name__ == "__main__":
    main()
