"""Tiny FP8 checkpoints in DeepSeek-V3's layout, written by us from models saved by
transformers (see shared/reference/fp8-and-tp-oracles.md, "Fixtures").

Each family is a tiny seeded model (hidden 256, 2 layers, vocabulary 512, 4 experts top-2)
saved in bf16 by its own ``save_pretrained`` (per-expert keys), then rewritten: every 2-D
``.weight`` except embeddings, lm_head, norms and routers becomes ``F8_E4M3`` plus an
``F32`` ``.weight_scale_inv`` on the ceil grid of 128×128 blocks, by the quantize formula
written out independently here (zero-padded tiles); config.json gets
``quantization_config``.

``dsv3``'s ``kv_a_proj_with_mqa`` has 192 rows (2 scale rows), ``dsv3x``'s 320 (3 scale
rows, 320 % 3 ≠ 0): the shapes transformers gets wrong.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

QUANT_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [128, 128]}
COMMON = dict(hidden_size=256, num_hidden_layers=2, vocab_size=512, tie_word_embeddings=False,
              num_attention_heads=4, num_key_value_heads=2)
NOT_QUANTIZED = ("embed_tokens", "lm_head", "norm", "mlp.gate.", "block_sparse_moe.gate.")


def dsv3_config(kv_lora: int = 128):
    import transformers as T
    return T.DeepseekV3Config(
        **COMMON, intermediate_size=512, moe_intermediate_size=128, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=128,
        kv_lora_rank=kv_lora, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=128,
        n_group=1, topk_group=1)


def family(name: str):
    """``(model class, config)`` of a fixture family."""
    import transformers as T
    if name == "dsv3":
        return T.DeepseekV3ForCausalLM, dsv3_config()
    if name == "dsv3x":
        return T.DeepseekV3ForCausalLM, dsv3_config(kv_lora=256)
    if name == "qwen3moe":
        return T.Qwen3MoeForCausalLM, T.Qwen3MoeConfig(
            **COMMON, moe_intermediate_size=128, intermediate_size=128, num_experts=4,
            num_experts_per_tok=2, head_dim=64, decoder_sparse_step=1)
    if name == "qwen3moe-wide":  # rows of 512-1024 packed columns: slices read by runs
        return T.Qwen3MoeForCausalLM, T.Qwen3MoeConfig(
            **{**COMMON, "num_attention_heads": 16, "num_key_value_heads": 4},
            moe_intermediate_size=1024, intermediate_size=1024, num_experts=4,
            num_experts_per_tok=2, head_dim=64, decoder_sparse_step=1)
    if name == "mixtral":
        return T.MixtralForCausalLM, T.MixtralConfig(
            **COMMON, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2,
            head_dim=64)
    if name == "llama":  # k/v_proj: 128 rows, 64 per rank under TP=2 (transformers divides by 0)
        return T.LlamaForCausalLM, T.LlamaConfig(**COMMON, intermediate_size=512, head_dim=64)
    raise KeyError(name)


FAMILIES = ("dsv3", "dsv3x", "qwen3moe", "mixtral")


def ref_quant(w: torch.Tensor, block=(128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """The quantize formula, tile by tile on a zero-padded copy (independent of weightplan)."""
    rows, cols = w.shape
    b0, b1 = block
    nr, nc = math.ceil(rows / b0), math.ceil(cols / b1)
    padded = torch.zeros(nr * b0, nc * b1)
    padded[:rows, :cols] = w.float()
    q = torch.empty_like(padded, dtype=torch.float8_e4m3fn)
    inv = torch.empty(nr, nc)
    for i in range(nr):
        for j in range(nc):
            tile = padded[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1]
            amax = tile.abs().amax()
            scale = 448.0 / amax if amax > 0 else torch.tensor(1.0)
            q[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] = (tile * scale).clamp(-448, 448).to(q.dtype)
            inv[i, j] = 1.0 / scale
    return q[:rows, :cols].contiguous(), inv


def ref_dequant(q: torch.Tensor, s: torch.Tensor, block=(128, 128), dtype=torch.bfloat16
                ) -> torch.Tensor:
    """Ceil blocks, block by block: scale row ``i`` covers rows ``[i·b0, (i+1)·b0)``."""
    out = torch.empty(q.shape, dtype=dtype)
    b0, b1 = block
    for i in range(s.shape[-2]):
        for j in range(s.shape[-1]):
            rs, cs = slice(i * b0, (i + 1) * b0), slice(j * b1, (j + 1) * b1)
            out[..., rs, cs] = (q[..., rs, cs].float() * s[..., i, j, None, None].float()).to(dtype)
    return out


def quantizes(key: str, value: torch.Tensor) -> bool:
    return value.dim() == 2 and key.endswith(".weight") and not any(n in key for n in NOT_QUANTIZED)


def write_fp8(bf16_dir: Path, fp8_dir: Path) -> Path:
    """``bf16_dir`` rewritten in DeepSeek-V3's FP8 layout (see the module docstring)."""
    fp8_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, value in load_file(str(bf16_dir / "model.safetensors")).items():
        if quantizes(key, value):
            out[key], out[key + "_scale_inv"] = ref_quant(value)
        else:
            out[key] = value
    save_file(out, str(fp8_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((bf16_dir / "config.json").read_text())
    config["quantization_config"] = dict(QUANT_CONFIG)
    (fp8_dir / "config.json").write_text(json.dumps(config, indent=2))
    return fp8_dir


def build(name: str, root: Path, families=None) -> tuple[Path, Path]:
    """``(bf16 dir, fp8 dir)`` of a family under ``root`` (written once); ``families``:
    name → (model class, config), :func:`family` unless given."""
    bf16_dir, fp8_dir = root / f"{name}-bf16", root / f"{name}-fp8"
    if not (fp8_dir / "config.json").exists():
        cls, cfg = (families or family)(name)
        torch.manual_seed(0)
        model = cls(cfg).to(torch.bfloat16)
        if bf16_dir.exists():
            shutil.rmtree(bf16_dir)
        model.save_pretrained(bf16_dir)
        write_fp8(bf16_dir, fp8_dir)
    return bf16_dir, fp8_dir
