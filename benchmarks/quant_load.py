"""Quantized checkpoints → bf16 models: weightplan vs transformers' own dequantizing load
vs the copy floor of the packed bytes, per format.

    python benchmarks/quant_load.py [--size-mb 1536] [--repeat 3] [--formats mxfp4,int4,...]
        [--cache DIR] [--threads 4]

Each format gets a checkpoint whose bf16 model is about ``--size-mb`` (default ~1.5 GB):
a Llama-style model (hidden 1024, intermediate 4096, every linear layer quantized but
``lm_head``) for compressed-tensors INT4 (group 32, symmetric), FP8 (per channel), NVFP4
and ModelOpt NVFP4; a gpt-oss model (16 experts of 1024 × 1024) for MXFP4. The packed
bytes are random but valid (no FP8 NaN, positive scales): the work is the same as a real
checkpoint's. Contenders, each in a fresh process with a warm page cache, in alternating
order:

* weightplan    ``explain(model, dir, dtype=bf16)`` + ``execute`` into the model built
                under ``init_empty`` (construction not timed)
* transformers  ``from_pretrained(dir, dtype=bf16)`` dequantizing (compressed-tensors:
                ``CompressedTensorsConfig(dequantize=True)``; gpt-oss on a CPU dequantizes
                MXFP4 itself); ModelOpt NVFP4 has no CPU path in transformers: n/a
* floor         every packed tensor read and cloned into fresh memory (the bytes on disk)

It prints medians and the ratios the issue targets: weightplan ≤ 0.4× transformers,
≤ 2.5× the floor, peak RSS ≤ 1.05× the bf16 model.
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
sys.path.insert(0, str(HERE.parent))

from benchmarks.load import _reset_peak, _rss, alternating, warm_cache  # noqa: E402

FORMATS = ("mxfp4", "int4", "fp8", "nvfp4", "modelopt")
CT_WEIGHTS = {
    "int4": ("pack-quantized", {"num_bits": 4, "type": "int", "strategy": "group",
                                "group_size": 32, "symmetric": True}),
    "fp8": ("float-quantized", {"num_bits": 8, "type": "float", "strategy": "channel",
                                "symmetric": True}),
    "nvfp4": ("nvfp4-pack-quantized", {"num_bits": 4, "type": "float",
                                       "strategy": "tensor_group", "group_size": 16,
                                       "symmetric": True})}
HIDDEN, INTER, VOCAB = 1024, 4096, 8192


def _llama(layers: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": layers,
            "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": VOCAB,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _gptoss(layers: int) -> dict:
    return {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
            "hidden_size": HIDDEN, "intermediate_size": HIDDEN, "num_hidden_layers": layers,
            "num_local_experts": 16, "num_experts_per_tok": 2, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 64, "vocab_size": VOCAB,
            "layer_types": (["sliding_attention", "full_attention"] * layers)[:layers],
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                "model.layers.*.self_attn", "model.layers.*.mlp.router",
                "model.embed_tokens", "lm_head"]}}


def _parts(fmt: str, out: int, n: int, g) -> dict:
    """Random valid stored tensors of one ``[out, n]`` weight (suffix → tensor)."""
    import torch

    def f8(*shape, positive=False):
        b = torch.randint(0, 0x7F if positive else 256, shape, generator=g, dtype=torch.uint8)
        return b.masked_fill_((b & 0x7F) == 0x7F, 0x38).view(torch.float8_e4m3fn)

    if fmt == "int4":
        return {"weight_packed": torch.randint(-2**31, 2**31 - 1, (out, n // 8), generator=g,
                                               dtype=torch.int32),
                "weight_scale": (torch.rand(out, n // 32, generator=g) / 64).to(torch.bfloat16),
                "weight_shape": torch.tensor([out, n])}
    if fmt == "fp8":
        return {"weight": f8(out, n), "weight_scale": (torch.rand(out, 1, generator=g) / 64)
                .to(torch.bfloat16)}
    u8 = torch.randint(0, 256, (out, n // 2), generator=g, dtype=torch.uint8)
    scale = f8(out, n // 16, positive=True)
    glob = torch.tensor([448.0 * 6], dtype=torch.float32)
    if fmt == "nvfp4":
        return {"weight_packed": u8, "weight_scale": scale, "weight_global_scale": glob}
    return {"weight": u8, "weight_scale": scale, "weight_scale_2": (1 / glob).reshape(())}


def build(directory: Path, fmt: str, size_mb: int) -> None:
    """Write the checkpoint of ``fmt`` (see the module docstring), once."""
    import torch
    from safetensors.torch import save_file

    if (directory / "config.json").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    bf = lambda *s: (torch.randn(*s, generator=g) / 32).to(torch.bfloat16)  # noqa: E731
    tensors = {"model.embed_tokens.weight": bf(VOCAB, HIDDEN), "lm_head.weight": bf(VOCAB, HIDDEN),
               "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16)}
    if fmt == "mxfp4":
        layers = max(2, round(size_mb * 2**20 / (3 * 16 * HIDDEN * HIDDEN * 2)))
        config = _gptoss(layers)
        tensors |= _gptoss_layers(config, g, bf)
    else:
        layers = max(1, round(size_mb * 2**20 / ((4 * HIDDEN + 3 * INTER) * HIDDEN * 2)))
        config = _llama(layers)
        for i in range(layers):
            p = f"model.layers.{i}."
            tensors |= {p + "input_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
                        p + "post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16)}
            for name, (out, n) in {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (HIDDEN, HIDDEN),
                                   "self_attn.v_proj": (HIDDEN, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
                                   "mlp.gate_proj": (INTER, HIDDEN), "mlp.up_proj": (INTER, HIDDEN),
                                   "mlp.down_proj": (HIDDEN, INTER)}.items():
                tensors |= {f"{p}{name}.{k}": v for k, v in _parts(fmt, out, n, g).items()}
        _quant_config(config, directory, fmt)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))


def _gptoss_layers(config: dict, g, bf) -> dict:
    import torch

    out, e, h = {}, config["num_local_experts"], HIDDEN
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                p + "mlp.router.weight": bf(e, h), p + "mlp.router.bias": bf(e),
                p + "self_attn.sinks": bf(16)}
        for name, rows in (("q_proj", 16 * 64), ("k_proj", 8 * 64), ("v_proj", 8 * 64)):
            out |= {f"{p}self_attn.{name}.weight": bf(rows, h), f"{p}self_attn.{name}.bias": bf(rows)}
        out |= {p + "self_attn.o_proj.weight": bf(h, 16 * 64), p + "self_attn.o_proj.bias": bf(h)}
        for name, rows, cols in (("gate_up_proj", 2 * h, h), ("down_proj", h, h)):
            key = p + "mlp.experts." + name
            out[key + "_blocks"] = torch.randint(0, 256, (e, rows, cols // 32, 16), generator=g,
                                                 dtype=torch.uint8)
            out[key + "_scales"] = torch.randint(118, 124, (e, rows, cols // 32), generator=g,
                                                 dtype=torch.uint8)
            out[key + "_bias"] = bf(e, rows)
    return out


def _quant_config(config: dict, directory: Path, fmt: str) -> None:
    if fmt == "modelopt":
        (directory / "hf_quant_config.json").write_text(json.dumps({"quantization": {
            "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}}))
        return
    name, weights = CT_WEIGHTS[fmt]
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": name, "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}


def child(mode: str, directory: Path, threads: int) -> dict:
    """One measurement, in this (fresh) process."""
    import torch
    import transformers

    import weightplan

    config = transformers.AutoConfig.from_pretrained(directory)
    cls = getattr(transformers, config.architectures[0])
    model = None
    if mode == "weightplan":
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        with weightplan.init_empty():
            model = cls(config)
    elif mode == "floor":
        from safetensors.torch import load_file
    kwargs: dict = {}
    if mode == "transformers" and (directory / "hf_quant_config.json").exists():
        return {"mode": mode, "seconds": None, "rss_peak": None, "model_bytes": None}
    if mode == "transformers" and config.quantization_config.get("quant_method") != "mxfp4":
        kwargs["quantization_config"] = transformers.CompressedTensorsConfig(dequantize=True)
    baseline = _rss("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    if mode == "floor":
        held = {k: t.clone() for k, t in load_file(str(directory / "model.safetensors")).items()}
        nbytes = sum(t.nbytes for t in held.values())
    elif mode == "weightplan":
        weightplan.explain(model, directory, dtype=torch.bfloat16, threads=threads).execute(
            progress=False)
    else:
        model = cls.from_pretrained(directory, dtype=torch.bfloat16, **kwargs)
    seconds = time.perf_counter() - start
    if model is not None:
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        assert all(p.dtype == torch.bfloat16 for n, p in model.named_parameters()
                   if n.endswith("proj.weight") or n.endswith("_proj")), "not dequantized"
    return {"mode": mode, "seconds": seconds, "rss_peak": _rss("VmHWM") - baseline,
            "model_bytes": nbytes}


def run_child(mode: str, directory: Path, threads: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--cache", str(directory),
                          "--threads", str(threads)], check=True, capture_output=True, text=True,
                         env={**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(fmt: str, results: dict[str, list[dict]]) -> None:
    med = {m: statistics.median(r["seconds"] for r in runs) if runs[0]["seconds"] is not None
           else None for m, runs in results.items()}
    wp = results["weightplan"]
    model_bytes = wp[0]["model_bytes"]
    rss = statistics.median(r["rss_peak"] for r in wp) / model_bytes
    packed = results["floor"][0]["model_bytes"]
    tf = med.get("transformers")
    vs_tf = f"{med['weightplan'] / tf:.2f}× transformers ({tf:.2f} s)" if tf else \
        "transformers n/a (no CPU path)"
    print(f"{fmt:9s} bf16 model {model_bytes / 2**20:,.0f} MiB from {packed / 2**20:,.0f} MiB "
          f"packed: weightplan {med['weightplan']:.2f} s = {vs_tf}, "
          f"{med['weightplan'] / med['floor']:.2f}× floor ({med['floor']:.2f} s), "
          f"peak RSS {rss:.3f}× the bf16 model  [targets ≤ 0.4×, ≤ 2.5×, ≤ 1.05×]", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1536, help="bf16 model size per format")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--cache", type=Path, default=Path("/tmp/weightplan-quant-load"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.cache, args.threads)))
        return
    for fmt in args.formats.split(","):
        directory = args.cache / f"{fmt}-{args.size_mb}mb"
        build(directory, fmt, args.size_mb)
        warm_cache(directory)
        report(fmt, alternating(["weightplan", "transformers", "floor"], args.repeat,
                                lambda m, d=directory: run_child(m, d, args.threads)))


if __name__ == "__main__":
    main()
