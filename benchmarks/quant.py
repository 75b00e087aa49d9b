"""Quantized frontier checkpoints at scale: header-only gpt-oss-120b (MXFP4 experts) and
Kimi-K2-Thinking (compressed-tensors INT4 routed experts, bf16 rest), explained by
weightplan into their floating models on meta.

    python benchmarks/quant.py [--only gpt-oss-120b] [--repeat 5] [--cache DIR] [--layers N]
                               [--phases]

The fixtures are sparse safetensors (:mod:`benchmarks.frontier`'s writer) with the real key
names, dtypes, shapes and shard counts, each file laid out as the ``safetensors`` library
writes it (sorted by dtype, then name: the I64 ``weight_shape`` tensors first, side by
side), plus the only data bytes a plan reads: each ``weight_shape`` (pack-quantized's
logical shape). Kimi-K2 uses DeepSeek-V3's model class
(its ``model_type`` ``kimi_k2`` is remote code; the architecture is DeepSeek-V3's). It
prints the median ``explain()`` CPU time (target ≤ 1.0 s each), the problem count (target
0), and the plan's format note (stored bytes → dequantized bytes); ``--phases``, the CPU time by
pipeline phase as well (:mod:`benchmarks.plan`'s, the quantized context's pairing and routed
checkpoint inside it).

The loads themselves (each format → bf16 vs transformers' dequantizing load and the copy
floor, with peak RSS) are :mod:`benchmarks.quant_load`: ``python benchmarks/quant_load.py
--size-mb 384``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks import frontier  # noqa: E402
from benchmarks.frontier import DEEPSEEK_V3, Entry, _mlp  # noqa: E402

GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
    "intermediate_size": 2880, "num_hidden_layers": 36, "num_local_experts": 128,
    "num_experts_per_tok": 4, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "vocab_size": 201088, "sliding_window": 128, "swiglu_limit": 7.0,
    "rms_norm_eps": 1e-05, "rope_theta": 150000, "max_position_embeddings": 131072,
    "tie_word_embeddings": False, "attention_bias": True, "torch_dtype": "bfloat16",
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"]},
}
KIMI_K2 = {**DEEPSEEK_V3, "n_routed_experts": 384, "first_k_dense_replace": 1,
           "num_attention_heads": 64, "num_key_value_heads": 64, "vocab_size": 163840,
           "num_nextn_predict_layers": 0, "routed_scaling_factor": 2.827, "n_group": 1,
           "topk_group": 1, "rope_theta": 50000.0,
           "quantization_config": {
               "quant_method": "compressed-tensors", "format": "pack-quantized",
               "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                   "num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
                   "symmetric": True, "dynamic": False}, "input_activations": None}},
               "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                          "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]}}


def gpt_oss_keys(c: dict) -> Iterator[Entry]:
    h, e, inter, hd = c["hidden_size"], c["num_local_experts"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", "BF16", (c["vocab_size"], h)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        yield from frontier.attention_keys(p, h, q, kv, bias=True)
        yield f"{p}.self_attn.sinks", "BF16", (c["num_attention_heads"],)
        yield f"{p}.mlp.router.weight", "BF16", (e, h)
        yield f"{p}.mlp.router.bias", "BF16", (e,)
        for name, rows, cols in (("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)):
            yield f"{p}.mlp.experts.{name}_blocks", "U8", (e, rows, cols // 32, 16)
            yield f"{p}.mlp.experts.{name}_scales", "U8", (e, rows, cols // 32)
            yield f"{p}.mlp.experts.{name}_bias", "BF16", (e, rows)
    yield "model.norm.weight", "BF16", (h,)
    yield "lm_head.weight", "BF16", (c["vocab_size"], h)


def _int4(key: str, out: int, inp: int) -> Iterator[Entry]:
    base = key.removesuffix(".weight")
    yield f"{base}.weight_packed", "I32", (out, inp // 8)
    yield f"{base}.weight_scale", "BF16", (out, inp // 32)
    yield f"{base}.weight_shape", "I64", (2,)


def kimi_keys(c: dict) -> Iterator[Entry]:
    h, inter = c["hidden_size"], c["moe_intermediate_size"]
    for key, dtype, shape in frontier.deepseek_v3_keys(c, False):
        if ".mlp.experts." not in key:
            yield key, dtype, shape
        elif key.endswith("gate_proj.weight") or key.endswith("up_proj.weight"):
            yield from _int4(key, inter, h)
        else:
            yield from _int4(key, h, inter)


FIXTURES = {"gpt-oss-120b": (GPT_OSS_120B, gpt_oss_keys, 15, 5),
            "kimi-k2": (KIMI_K2, kimi_keys, 62, 6)}
_ = _mlp  # (the DeepSeek-V3 expert layout kimi_keys rewrites)


def write(name: str, directory: Path, layers: int | None = None) -> Path:
    """The sparse fixture, with every ``weight_shape``'s values written in."""
    frontier.FIXTURES.update(FIXTURES)
    frontier.write_fixture(name, directory, layers, safetensors_order=True)
    config = json.loads((directory / "config.json").read_text())
    if "layer_types" in config:  # (gpt-oss: one per layer)
        config["layer_types"] = config["layer_types"][:config["num_hidden_layers"]]
        (directory / "config.json").write_text(json.dumps(config, indent=2))
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    headers = {file: _header(directory / file) for file in set(index["weight_map"].values())}
    shapes = {k: v["shape"] for _, header in headers.values() for k, v in header.items()
              if k != "__metadata__"}
    for file, (size, header) in headers.items():
        with open(directory / file, "r+b") as f:
            for key, info in header.items():
                if key.endswith(".weight_shape"):
                    base = key.removesuffix("_shape")
                    rows, words = shapes[base + "_packed"]
                    cols = min(words * 8, shapes[base + "_scale"][1] * 32)
                    f.seek(8 + size + info["data_offsets"][0])
                    f.write(struct.pack("<qq", rows, cols))
    return directory


def _header(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        return size, json.loads(f.read(size))


def fixture(cache: Path, name: str, layers: int | None = None) -> Path:
    directory = cache / (name if layers is None else f"{name}-{layers}l")
    directory = directory.with_name(directory.name + "-st")  # (the layout safetensors writes)
    if not (directory / "config.json").exists():
        write(name, directory, layers)
    return directory


# ``--phases``: benchmarks/plan.py's phases, the quantized context's two parts (the
# pairing, and the checkpoint routing sees: indented, inside it) and the packed findings
_QUANT = "weightplan.planner.tensors.ir.quant_build"
NESTED = ((_QUANT, "packed_pairing"), (_QUANT, "routed_entries"))


def _phases() -> tuple[tuple[str, str], ...]:
    """plan.py's phases, the nested ones right after the quantized context."""
    from benchmarks.plan import PHASES

    at = [name for _, name in PHASES].index("_quant_context") + 1
    return PHASES[:at] + NESTED + PHASES[at:]


def measure(directory: Path, repeat: int, phases: bool = False) -> dict:
    import torch

    import weightplan
    from benchmarks.plan import PhaseTimer, meta_model

    model = meta_model(directory)
    cpu, wall, split = [], [], []
    plan = None
    for _ in range(repeat):
        plan = None
        timer = PhaseTimer(_phases()) if phases else None
        start, start_cpu = time.perf_counter(), time.process_time()
        plan = weightplan.explain(model, directory, dtype=torch.bfloat16)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        if timer is not None:
            timer.close()
            split.append(timer.seconds)
    assert plan is not None
    notes = [n.message for n in plan.notes if n.key.startswith("<")]
    return {"keys": len(plan.checkpoint), "cpu": statistics.median(cpu),
            "wall": statistics.median(wall), "problems": len(plan.problems), "notes": notes,
            "phases": {name: statistics.median(s.get(name, 0.0) for s in split)
                       for _, name in _phases()} if split else {}}


def print_phases(r: dict) -> None:
    """The median split of ``explain()``'s CPU time by phase (the nested ones indented)."""
    nested = {name for _, name in NESTED}
    rest = r["cpu"] - sum(s for name, s in r["phases"].items() if name not in nested)
    for name, seconds in (*r["phases"].items(), ("(the rest)", rest)):
        label = ("  " if name in nested else "") + name
        print(f"    {label:<24}{seconds:>7.3f} s  {100 * seconds / r['cpu']:>5.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(FIXTURES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/weightplan-quant-fixtures"))
    parser.add_argument("--phases", action="store_true",
                        help="print explain()'s CPU time by pipeline phase too (medians)")
    args = parser.parse_args()
    for name in [args.only] if args.only else FIXTURES:
        r = measure(fixture(args.cache, name, args.layers), args.repeat, args.phases)
        print(f"{name}: {r['keys']:,} keys — explain {r['cpu']:.3f} s of CPU "
              f"({r['wall']:.3f} s wall; medians; target ≤ 1.0 s), {r['problems']} problems")
        for note in r["notes"]:
            print(f"  {note}")
        if r["phases"]:
            print_phases(r)


if __name__ == "__main__":
    main()
