"""Header-only copies of frontier checkpoints: sparse safetensors files with real key names.

Each shard is written as its 8-byte header length and JSON header, then ``os.truncate``d
to its full size, so the data region is a hole: DeepSeek-V3 (≈690 GB) costs ≈40 MB of
disk. Key names, dtypes and shapes follow the published checkpoints (from each
architecture's published config); shards are filled in key order up to the published
shard count, which approximates (not copies) the published shard boundaries.

    python benchmarks/frontier.py DIR [--only deepseek-v3-fp8] [--layers N]

``layers=`` shrinks a model (unit tests use 2-5 layers); the key *structure* is kept.

| name | keys | shards |
|---|---|---|
| deepseek-v3-fp8 | 91,991 | 163 |
| deepseek-v3-bf16 | 46,183 | 275 |
| qwen3-235b-a22b | 36,945 | 118 |
| llama-3.1-405b | 1,137 | 191 |
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

Entry = tuple[str, str, tuple[int, ...]]  # key, safetensors dtype, shape
_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I64": 8, "U8": 1, "I32": 4}

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
    "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "vocab_size": 129280, "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
    "rope_theta": 10000, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "initializer_range": 0.02, "use_cache": True, "torch_dtype": "bfloat16",
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
}
DEEPSEEK_V3_FP8 = {**DEEPSEEK_V3, "quantization_config": {
    "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
    "weight_block_size": [128, 128]}}
QWEN3_235B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
    "num_hidden_layers": 94, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
    "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "initializer_range": 0.02, "output_router_logits": False,
    "router_aux_loss_coef": 0.001, "sliding_window": None, "use_sliding_window": False,
    "use_cache": True, "torch_dtype": "bfloat16",
}
LLAMA_405B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16384,
    "intermediate_size": 53248, "num_hidden_layers": 126, "num_attention_heads": 128,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0,
    "mlp_bias": False, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True,
    "torch_dtype": "bfloat16",
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}


def _linear(key: str, out: int, inp: int, fp8: bool) -> Iterator[Entry]:
    """A weight; in FP8 checkpoints, E4M3 with a 128×128-block F32 ``weight_scale_inv``."""
    if not fp8:
        yield key, "BF16", (out, inp)
        return
    yield key, "F8_E4M3", (out, inp)
    yield key.removesuffix("weight") + "weight_scale_inv", "F32", (-(-out // 128), -(-inp // 128))


def _deepseek_layer(c: dict, i: int, fp8: bool) -> Iterator[Entry]:
    h, p = c["hidden_size"], f"model.layers.{i}"
    heads, rope, nope, v = (c["num_attention_heads"], c["qk_rope_head_dim"],
                            c["qk_nope_head_dim"], c["v_head_dim"])
    q_lora, kv_lora = c["q_lora_rank"], c["kv_lora_rank"]
    yield f"{p}.input_layernorm.weight", "BF16", (h,)
    yield f"{p}.post_attention_layernorm.weight", "BF16", (h,)
    a = f"{p}.self_attn"
    yield from _linear(f"{a}.q_a_proj.weight", q_lora, h, fp8)
    yield f"{a}.q_a_layernorm.weight", "BF16", (q_lora,)
    yield from _linear(f"{a}.q_b_proj.weight", heads * (nope + rope), q_lora, fp8)
    yield from _linear(f"{a}.kv_a_proj_with_mqa.weight", kv_lora + rope, h, fp8)
    yield f"{a}.kv_a_layernorm.weight", "BF16", (kv_lora,)
    yield from _linear(f"{a}.kv_b_proj.weight", heads * (nope + v), kv_lora, fp8)
    yield from _linear(f"{a}.o_proj.weight", h, heads * v, fp8)
    if i < c["first_k_dense_replace"]:
        yield from _mlp(f"{p}.mlp", h, c["intermediate_size"], fp8)
        return
    yield f"{p}.mlp.gate.weight", "BF16", (c["n_routed_experts"], h)
    yield f"{p}.mlp.gate.e_score_correction_bias", "F32", (c["n_routed_experts"],)
    for e in range(c["n_routed_experts"]):
        yield from _mlp(f"{p}.mlp.experts.{e}", h, c["moe_intermediate_size"], fp8)
    yield from _mlp(f"{p}.mlp.shared_experts", h,
                    c["moe_intermediate_size"] * c["n_shared_experts"], fp8)


def _mlp(p: str, h: int, inter: int, fp8: bool) -> Iterator[Entry]:
    yield from _linear(f"{p}.gate_proj.weight", inter, h, fp8)
    yield from _linear(f"{p}.up_proj.weight", inter, h, fp8)
    yield from _linear(f"{p}.down_proj.weight", h, inter, fp8)


def deepseek_v3_keys(c: dict, fp8: bool) -> Iterator[Entry]:
    h, vocab = c["hidden_size"], c["vocab_size"]
    yield "model.embed_tokens.weight", "BF16", (vocab, h)
    layers = c["num_hidden_layers"]
    for i in range(layers + c.get("num_nextn_predict_layers", 0)):
        yield from _deepseek_layer(c, i, fp8)
        if i >= layers:  # the multi-token-prediction layer's extra modules
            p = f"model.layers.{i}"
            yield f"{p}.enorm.weight", "BF16", (h,)
            yield f"{p}.hnorm.weight", "BF16", (h,)
            yield f"{p}.eh_proj.weight", "BF16", (h, 2 * h)
            yield f"{p}.embed_tokens.weight", "BF16", (vocab, h)
            yield f"{p}.shared_head.norm.weight", "BF16", (h,)
            yield f"{p}.shared_head.head.weight", "BF16", (vocab, h)
    yield "model.norm.weight", "BF16", (h,)
    yield "lm_head.weight", "BF16", (vocab, h)


def attention_keys(p: str, h: int, q: int, kv: int, bias: bool = False) -> Iterator[Entry]:
    """A decoder layer's two norms and its q/k/v/o projections (with biases: gpt-oss)."""
    yield f"{p}.input_layernorm.weight", "BF16", (h,)
    yield f"{p}.post_attention_layernorm.weight", "BF16", (h,)
    for name, out, inp in (("q", q, h), ("k", kv, h), ("v", kv, h), ("o", h, q)):
        yield f"{p}.self_attn.{name}_proj.weight", "BF16", (out, inp)
        if bias:
            yield f"{p}.self_attn.{name}_proj.bias", "BF16", (out,)


def qwen3_moe_keys(c: dict) -> Iterator[Entry]:
    h, hd = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", "BF16", (c["vocab_size"], h)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        yield from attention_keys(p, h, q, kv)
        yield f"{p}.self_attn.q_norm.weight", "BF16", (hd,)
        yield f"{p}.self_attn.k_norm.weight", "BF16", (hd,)
        yield f"{p}.mlp.gate.weight", "BF16", (c["num_experts"], h)
        for e in range(c["num_experts"]):
            yield from _mlp(f"{p}.mlp.experts.{e}", h, c["moe_intermediate_size"], False)
    yield "model.norm.weight", "BF16", (h,)
    yield "lm_head.weight", "BF16", (c["vocab_size"], h)


def llama_keys(c: dict) -> Iterator[Entry]:
    h = c["hidden_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    yield "model.embed_tokens.weight", "BF16", (c["vocab_size"], h)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        yield from attention_keys(p, h, h, kv)
        yield from _mlp(f"{p}.mlp", h, c["intermediate_size"], False)
    yield "model.norm.weight", "BF16", (h,)
    yield "lm_head.weight", "BF16", (c["vocab_size"], h)


# name: (config, keys(config), published shard count, shard name digits)
FIXTURES: dict[str, tuple[dict, Callable[[dict], Iterator[Entry]], int, int]] = {
    "deepseek-v3-fp8": (DEEPSEEK_V3_FP8, lambda c: deepseek_v3_keys(c, True), 163, 6),
    "deepseek-v3-bf16": (DEEPSEEK_V3, lambda c: deepseek_v3_keys(c, False), 275, 5),
    "qwen3-235b-a22b": (QWEN3_235B, qwen3_moe_keys, 118, 5),
    "llama-3.1-405b": (LLAMA_405B, llama_keys, 191, 5),
}


def fixture_config(name: str, layers: int | None = None) -> dict:
    config = dict(FIXTURES[name][0])
    if layers is not None:
        config["num_hidden_layers"] = layers
        if "first_k_dense_replace" in config:
            config["first_k_dense_replace"] = min(config["first_k_dense_replace"], layers - 1)
    return config


def fixture_keys(name: str, layers: int | None = None) -> list[Entry]:
    return list(FIXTURES[name][1](fixture_config(name, layers)))


def write_fixture(name: str, directory: Path, layers: int | None = None, *,
                  safetensors_order: bool = False) -> Path:
    """Write the sparse shards, the index and ``config.json``; returns ``directory``.
    ``safetensors_order``: each shard's tensors laid out as the ``safetensors`` library
    writes them (:data:`SAFETENSORS_ORDER`), else in key order."""
    config = fixture_config(name, layers)
    entries = fixture_keys(name, layers)
    shards = min(FIXTURES[name][2], len(entries))
    digits = FIXTURES[name][3]
    directory.mkdir(parents=True, exist_ok=True)
    total = sum(_nbytes(e) for e in entries)
    weight_map: dict[str, str] = {}
    for n, chunk in enumerate(_split(entries, shards, total), start=1):
        file = f"model-{n:0{digits}d}-of-{shards:0{digits}d}.safetensors"
        _write_sparse(directory / file, chunk, safetensors_order)
        weight_map.update((key, file) for key, _, _ in chunk)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def _nbytes(entry: Entry) -> int:
    return math.prod(entry[2]) * _ITEMSIZE[entry[1]]


def _split(entries: list[Entry], shards: int, total: int) -> list[list[Entry]]:
    """Fill shards in key order, each up to an equal share of the bytes (exactly
    ``shards`` of them; ``shards`` is at most the number of entries)."""
    out: list[list[Entry]] = [[]]
    share, filled = total / shards, 0
    for entry in entries:
        if out[-1] and filled >= share * len(out) and len(out) < shards:
            out.append([])
        out[-1].append(entry)
        filled += _nbytes(entry)
    while len(out) < shards:  # big tensors took several shares: split the longest shards
        i = max(range(len(out)), key=lambda j: len(out[j]))
        half = len(out[i]) // 2
        out[i:i + 1] = [out[i][:half], out[i][half:]]
    return out


# ``safetensors``' own layout of a file (``save_file``): tensors sorted by dtype, this
# order (its ``Dtype`` enum, last first), then by name; the header lists them the same way
SAFETENSORS_ORDER = ("U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16", "U16",
                     "I16", "F8_E8M0", "F8_E4M3", "F8_E5M2", "I8", "U8", "BOOL")


def _write_sparse(path: Path, chunk: list[Entry], safetensors_order: bool = False) -> None:
    if safetensors_order:
        chunk = sorted(chunk, key=lambda e: (SAFETENSORS_ORDER.index(e[1]), e[0]))
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, dtype, shape in chunk:
        end = offset + _nbytes((key, dtype, shape))
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
    os.truncate(path, 8 + len(raw) + offset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--only", choices=sorted(FIXTURES))
    parser.add_argument("--layers", type=int)
    args = parser.parse_args()
    for name in [args.only] if args.only else FIXTURES:
        path = write_fixture(name, args.directory / name, args.layers)
        print(f"{name}: {len(fixture_keys(name, args.layers))} keys in {path}")


if __name__ == "__main__":
    main()
