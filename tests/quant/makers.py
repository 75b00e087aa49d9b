"""Tiny quantized tensors and checkpoints, made with compressed-tensors' own compressors
(the oracle decompresses them), an MXFP4 encoder checked against transformers'
dequantizer, and ModelOpt NVFP4 by hand."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from weightplan.planner.core.quant.formats import E2M1, Scheme

_MAGNITUDES = torch.tensor(E2M1[:8])


def ct_scheme(kind: str, **weights):
    """A compressed-tensors QuantizationScheme and its compressor for ``kind``."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    fmt = {"fp8": "float-quantized", "int": "pack-quantized", "nvfp4": "nvfp4-pack-quantized"}[kind]
    defaults = {"fp8": dict(num_bits=8, type="float"), "int": dict(num_bits=4, type="int"),
                "nvfp4": dict(num_bits=4, type="float", strategy="tensor_group", group_size=16)}
    args = QuantizationArgs(**{**defaults[kind], **weights})
    return (QuantizationScheme(targets=["Linear"], weights=args),
            BaseCompressor.load_from_registry(fmt))


def _grouped_amax(w: torch.Tensor, group: int) -> torch.Tensor:
    cols = w.shape[-1]
    return torch.stack([w[..., i:i + group].float().abs().amax(-1)
                        for i in range(0, cols, group)], -1)


def ct_compress(w: torch.Tensor, kind: str, strategy: str, *, group: int | None = None,
                block: tuple[int, int] | None = None, bits: int = 4, symmetric: bool = True,
                scale_dtype: torch.dtype = torch.bfloat16):
    """``(compressed state dict, oracle weight, compressed-tensors scheme)`` for a 2-D ``w``."""
    weights: dict = {"strategy": strategy, "symmetric": symmetric}
    if group is not None:
        weights["group_size"] = group
    if block is not None:
        weights["block_structure"] = list(block)
    if kind == "int":
        weights["num_bits"] = bits
    scheme, comp = ct_scheme(kind, **weights)
    sd = {"weight": w}
    if kind == "nvfp4":
        glob = (448.0 * 6.0 / w.float().abs().amax()).reshape(1).to(torch.float32)
        local = _grouped_amax(w, 16) / 6.0 * glob
        sd |= {"weight_scale": local.to(torch.float8_e4m3fn).to(torch.float32), "weight_global_scale": glob}
    elif kind == "fp8":
        qmax = 448.0
        if strategy == "tensor":
            amax = w.float().abs().amax().reshape(1)
        elif strategy == "channel":
            amax = w.float().abs().amax(-1, keepdim=True)
        elif strategy == "block":
            b0, b1 = block
            rows = torch.stack([w[i:i + b0].float().abs().amax(0) for i in range(0, w.shape[0], b0)])
            amax = _grouped_amax(rows, b1)
        else:
            amax = _grouped_amax(w, group)
        sd["weight_scale"] = (amax / qmax).clamp(min=1e-8).to(scale_dtype)
    else:
        qmax = (1 << (bits - 1)) - 1
        by = _grouped_amax(w, group) if strategy == "group" else w.float().abs().amax(-1, keepdim=True)
        if symmetric:
            sd["weight_scale"] = (by / qmax).clamp(min=1e-6).to(scale_dtype)
        else:
            lo = torch.stack([w[:, i:i + group].float().amin(-1) for i in range(0, w.shape[-1], group)], -1) \
                if strategy == "group" else w.float().amin(-1, keepdim=True)
            hi = torch.stack([w[:, i:i + group].float().amax(-1) for i in range(0, w.shape[-1], group)], -1) \
                if strategy == "group" else w.float().amax(-1, keepdim=True)
            scale = ((hi - lo) / (2 * qmax + 1)).clamp(min=1e-6)
            zero = (-qmax - 1 - torch.round(lo / scale)).clamp(-qmax - 1, qmax).to(torch.int8)
            sd |= {"weight_scale": scale.to(scale_dtype), "weight_zero_point": zero}
    packed = comp.compress(sd, scheme)
    oracle = comp.decompress(packed, scheme)["weight"]
    return packed, oracle, scheme


def nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pack E2M1 codes ``[..., 2k]`` into bytes ``[..., k]``, low nibble first."""
    c = codes.to(torch.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous()


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """The nearest E2M1 code of each value (already divided by its scale)."""
    mag = (x.abs()[..., None] - _MAGNITUDES).abs().argmin(-1)
    return mag | ((x < 0).to(torch.int64) << 3)


def mxfp4_encode(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(blocks [..., rows, in/32, 16], scales [..., rows, in/32])`` of ``[..., rows, in]``
    (E8M0 exponent: the power of two that brings the block's max to ≤ 6)."""
    x = w.float().unflatten(-1, (w.shape[-1] // 32, 32))
    amax = x.abs().amax(-1).clamp(min=2.0 ** -120)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    codes = e2m1_codes(x / exp.exp2()[..., None])
    return nibbles(codes), (exp + 127).to(torch.uint8)


def modelopt_nvfp4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """ModelOpt NVFP4 tensors of ``w`` [out, in]: ``weight`` U8, ``weight_scale`` F8 per 16,
    ``weight_scale_2`` (a multiplier: amax / (448·6))."""
    scale_2 = (w.float().abs().amax() / (448.0 * 6.0)).reshape(())
    local = (_grouped_amax(w, 16) / 6.0 / scale_2).to(torch.float8_e4m3fn)
    per = local.float() * scale_2
    per = per.repeat_interleave(16, -1)[:, : w.shape[-1]]
    codes = e2m1_codes(w.float() / torch.where(per > 0, per, torch.ones_like(per)))
    return {"weight": nibbles(codes), "weight_scale": local, "weight_scale_2": scale_2.to(torch.float32)}


def reference(scheme: Scheme, parts: list[torch.Tensor], shape: tuple[int, ...],
              dtype: torch.dtype) -> torch.Tensor:
    """A slow, element-wise restatement of the formulas (for layouts no oracle takes)."""
    out, n = shape[-2], shape[-1]
    w = torch.zeros(out, n, dtype=torch.float64)
    if scheme.format == "nvfp4":
        lut = torch.tensor(E2M1, dtype=torch.float64)
        b = parts[0].to(torch.int64)
        codes = torch.stack((b & 15, b >> 4), -1).flatten(-2)
        for r in range(out):
            for c in range(n):
                s = torch.tensor(parts[1][r, c // 16].float().item(), dtype=torch.float32)
                g = parts[2].reshape(-1)[0].float()
                s = s / g if scheme.global_divides else s * g
                w[r, c] = lut[codes[r, c]].item() * s.item()
        return w.to(torch.float32).to(dtype)
    raise NotImplementedError(scheme.format)


def write_checkpoint(directory: Path, tensors: dict[str, torch.Tensor], config: dict | None = None,
                     extra: dict[str, dict] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    for name, data in (extra or {}).items():
        (directory / name).write_text(json.dumps(data))
    return directory
