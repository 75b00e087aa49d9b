"""FP8 benchmark: a DeepSeek-V3-style FP8 checkpoint loaded dequantized into bf16.

Builds (or reuses) a ~1.1 GiB FP8 checkpoint in DeepSeek-V3's layout (MLA attention,
per-expert ``F8_E4M3`` weights with ``F32`` ``weight_scale_inv`` on the 128×128 ceil grid,
embeddings / norms / routers / lm_head in bf16, ``quantization_config`` in config.json;
dims are multiples of 128 so transformers can load it too) and times, each in a fresh
process with a warm page cache, alternating the order:

* weightplan   ``explain`` + ``execute`` into ``DeepseekV3ForCausalLM`` (bf16, built under
               ``init_empty``): dequantize nodes write straight into the parameters
* transformers ``from_pretrained(..., quantization_config=FineGrainedFP8Config(dequantize=True))``

Goals (issue 10): weightplan ≤ 0.5× transformers' time; peak RSS growth ≤ 1.05× the bf16
model.

    python benchmarks/fp8.py [--repeat 3] [--cache DIR] [--threads 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from load import _reset_peak, _rss, alternating, medians_table, warm_cache  # noqa: E402

DEFAULT_CACHE = HERE / ".cache" / "dsv3-fp8-1.1g"
DIMS = dict(vocab_size=32000, hidden_size=2048, intermediate_size=4096, moe_intermediate_size=1024,
            num_hidden_layers=9, num_attention_heads=16, num_key_value_heads=16,
            n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
            first_k_dense_replace=1, q_lora_rank=512, kv_lora_rank=448, qk_rope_head_dim=64,
            qk_nope_head_dim=128, v_head_dim=128, n_group=1, topk_group=1,
            tie_word_embeddings=False)
QUANT = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
         "weight_block_size": [128, 128]}
SKIP = ("embed_tokens", "lm_head", "norm", "mlp.gate.")


def original_layout(state: dict):
    """The model's (meta) state in the per-expert checkpoint layout: ``(key, shape, dtype)``."""
    for key, t in state.items():
        if key.endswith("experts.gate_up_proj"):
            base, half = key.removesuffix("gate_up_proj"), t.shape[1] // 2
            for e in range(t.shape[0]):
                yield f"{base}{e}.gate_proj.weight", (half, t.shape[2]), t.dtype
                yield f"{base}{e}.up_proj.weight", (half, t.shape[2]), t.dtype
        elif key.endswith("experts.down_proj"):
            base = key.removesuffix("down_proj")
            for e in range(t.shape[0]):
                yield f"{base}{e}.down_proj.weight", tuple(t.shape[1:]), t.dtype
        else:
            yield key, tuple(t.shape), t.dtype


def build_checkpoint(directory: Path) -> None:
    """Random bf16 weights (std 0.02) quantized by the formula, sharded like save_pretrained."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    sys.path.insert(0, str(HERE.parent))
    from weightplan.demo import write_sharded
    from weightplan.planner.core.quant.quantize import quantize

    if (directory / "config.json").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    cfg = DeepseekV3Config(**DIMS)
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(cfg)
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for key, shape, dtype in original_layout(model.state_dict()):
        value = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
        if len(shape) == 2 and key.endswith(".weight") and not any(s in key for s in SKIP):
            tensors[key], tensors[key + "_scale_inv"] = quantize(value, (128, 128))
        else:
            tensors[key] = value.to(dtype if dtype.is_floating_point else torch.bfloat16)
    write_sharded(tensors, directory, shards=4)
    cfg.dtype = torch.bfloat16
    cfg.save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = QUANT
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def child(mode: str, directory: Path, threads: int) -> dict:
    """One measurement, in this (fresh) process."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, FineGrainedFP8Config

    import weightplan

    model = None
    if mode == "weightplan":
        cfg = AutoConfig.from_pretrained(directory)
        cfg.quantization_config = None
        with weightplan.init_empty():
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    baseline = _rss("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    if mode == "weightplan":
        plan = weightplan.explain(model, directory, threads=threads)
        planned = time.perf_counter()
        plan.execute(progress=False)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.bfloat16,
            quantization_config=FineGrainedFP8Config(dequantize=True))
    seconds = time.perf_counter() - start
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    result = {"mode": mode, "seconds": seconds, "rss_peak": _rss("VmHWM") - baseline,
              "model_bytes": nbytes}
    if mode == "weightplan":
        result.update(explain_seconds=planned - start, planned_peak=plan.peak_bytes)
    return result


def run_child(mode: str, directory: Path, threads: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--cache", str(directory),
                          "--threads", str(threads)], check=True, capture_output=True, text=True,
                         env={**os.environ, "TRANSFORMERS_VERBOSITY": "error",
                              "HF_HUB_OFFLINE": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(results: dict[str, list[dict]], checkpoint_bytes: int) -> None:
    gib = 1024**3
    model_bytes = next(iter(results.values()))[0]["model_bytes"]
    med, rss, _ = medians_table(results, f"checkpoint {checkpoint_bytes / gib:.2f} GiB (FP8) → "
                                         f"bf16 model {model_bytes / gib:.2f} GiB")
    if "weightplan" in med:
        wp = results["weightplan"]
        planned = statistics.median(x["planned_peak"] for x in wp)
        print(f"weightplan explain: {statistics.median(x['explain_seconds'] for x in wp):.3f} s; "
              f"planned peak {planned / gib:.3f} GiB vs measured {rss['weightplan'] / gib:.3f} GiB "
              f"({rss['weightplan'] / planned:.3f})")
        if "transformers" in med:
            print(f"weightplan / transformers time: {med['weightplan'] / med['transformers']:.3f}"
                  "  (goal ≤ 0.5)")
        print(f"weightplan peak RSS / model:    {rss['weightplan'] / model_bytes:.3f}  (goal ≤ 1.05)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--modes", default="weightplan,transformers")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.cache, args.threads)))
        return
    build_checkpoint(args.cache)
    warm_cache(args.cache)
    size = sum(p.stat().st_size for p in args.cache.glob("*.safetensors"))
    report(alternating(args.modes.split(","), args.repeat,
                       lambda mode: run_child(mode, args.cache, args.threads)), size)


if __name__ == "__main__":
    main()
