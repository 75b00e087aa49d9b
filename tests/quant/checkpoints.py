"""Tiny quantized checkpoints of a transformers model (Qwen3-MoE, per-expert keys), and
the bf16 checkpoint of the oracle's dequantized weights next to each (same keys): a load
of the packed one must equal a plain load of the oracle one, parameter by parameter."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.fp8.checkpoints import family
from tests.quant.makers import ct_compress, modelopt_nvfp4

PLAIN = ("embed_tokens", "lm_head", "norm", "mlp.gate.")

CT_GROUP = {"int": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
                    "symmetric": True},
            "int-asym": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
                         "symmetric": False},
            "fp8-channel": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
            "fp8-tensor": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True},
            "fp8-block": {"num_bits": 8, "type": "float", "strategy": "block", "symmetric": True,
                          "block_structure": [64, 64]},
            "nvfp4": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                      "symmetric": True}}
CT_FORMAT = {"int": "pack-quantized", "int-asym": "pack-quantized", "nvfp4": "nvfp4-pack-quantized"}


def base_checkpoint(root: Path, name: str = "qwen3moe") -> Path:
    out = root / f"{name}-bf16"
    if not out.exists():
        cls, cfg = family(name)
        torch.manual_seed(0)
        model = cls(cfg).to(torch.bfloat16)
        model.save_pretrained(out)
    return out


def _compress(kind: str, w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    if kind == "modelopt":
        parts = modelopt_nvfp4(w)
        from weightplan.planner.core.quant.formats import Scheme, dequantize
        oracle = dequantize(Scheme("nvfp4", global_divides=False),
                            [parts["weight"], parts["weight_scale"], parts["weight_scale_2"]],
                            tuple(w.shape), torch.bfloat16)
        return parts, oracle
    g = CT_GROUP[kind]
    strategy = g["strategy"]
    packed, oracle, _ = ct_compress(
        w, kind.split("-")[0], strategy, group=g.get("group_size"),
        block=tuple(g["block_structure"]) if "block_structure" in g else None,
        bits=g["num_bits"], symmetric=g["symmetric"])
    return dict(packed), oracle.to(torch.bfloat16)


def quantized_checkpoint(root: Path, kind: str, experts_only: bool = False,
                         name: str = "qwen3moe") -> tuple[Path, Path]:
    """``(quantized dir, oracle bf16 dir)`` of ``kind`` (a :data:`CT_GROUP` key or
    ``modelopt``); ``experts_only``: only routed experts quantized (Kimi-K2's layout)."""
    base = base_checkpoint(root, name)
    qdir, odir = root / f"{name}-{kind}-{experts_only}", root / f"{name}-{kind}-{experts_only}-oracle"
    if qdir.exists():
        return qdir, odir
    tensors = load_file(str(base / "model.safetensors"))
    out, oracle = {}, {}
    for key, t in tensors.items():
        wanted = key.endswith(".weight") and t.dim() == 2 and not any(p in key for p in PLAIN)
        if experts_only:
            wanted = wanted and ".experts." in key
        if not wanted:
            out[key] = oracle[key] = t
            continue
        parts, deq = _compress(kind, t)
        module = key.removesuffix(".weight")
        out |= {f"{module}.{k}": v for k, v in parts.items()}
        oracle[key] = deq
    config = json.loads((base / "config.json").read_text())
    for d, ts in ((qdir, out), (odir, oracle)):
        d.mkdir()
        save_file({k: v.contiguous() for k, v in ts.items()}, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps(config))
    qconfig = json.loads((qdir / "config.json").read_text())
    if kind == "modelopt":
        (qdir / "hf_quant_config.json").write_text(json.dumps(
            {"producer": {"name": "modelopt"}, "quantization": {
                "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}}))
    else:
        targets = ["re:.*mlp\\.experts\\..*"] if experts_only else ["Linear"]
        qconfig["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": CT_FORMAT.get(kind, "float-quantized"),
            "config_groups": {"group_0": {"targets": targets, "weights": CT_GROUP[kind]}},
            "ignore": ["lm_head"]}
        (qdir / "config.json").write_text(json.dumps(qconfig))
    return qdir, odir
