"""The format math against the oracles: compressed-tensors' decompressors, transformers'
MXFP4 dequantizer, and (ModelOpt, odd sizes no oracle takes) an element-wise restatement."""

import pytest
import torch

from weightplan.planner.core.quant.formats import (
    Scheme, companion_shapes, dequantize, logical_shape, unpack_ints, workspace_bytes,
)
from tests.quant.makers import ct_compress, modelopt_nvfp4, mxfp4_encode, reference

pytest.importorskip("compressed_tensors")


def _weight(out=40, n=96, seed=0):
    torch.manual_seed(seed)
    return torch.randn(out, n, dtype=torch.bfloat16)


@pytest.mark.parametrize("strategy,kw", [("tensor", {}), ("channel", {}),
                                         ("block", {"block": (16, 32)}), ("group", {"group": 32})])
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32])
def test_fp8_matches_compressed_tensors(strategy, kw, scale_dtype):
    packed, oracle, _ = ct_compress(_weight(), "fp8", strategy, scale_dtype=scale_dtype, **kw)
    scheme = Scheme("fp8", strategy, kw.get("group"), kw.get("block"), bits=8)
    parts = [packed["weight"], packed["weight_scale"]]
    assert companion_shapes(scheme, (40, 96))["scale"] == tuple(packed["weight_scale"].shape)
    got = dequantize(scheme, parts, (40, 96), torch.bfloat16)
    assert torch.equal(got, oracle.to(torch.bfloat16))


@pytest.mark.parametrize("bits,strategy,group,symmetric", [
    (4, "group", 32, True), (4, "group", 32, False), (8, "channel", None, True),
    (4, "channel", None, False), (8, "group", 32, False)])
def test_pack_quantized_matches_compressed_tensors(bits, strategy, group, symmetric):
    w = _weight(out=37)  # odd rows: packed zero points along out straddle a word
    packed, oracle, _ = ct_compress(w, "int", strategy, group=group, bits=bits,
                                    symmetric=symmetric)
    scheme = Scheme("int", strategy, group, bits=bits, symmetric=symmetric)
    roles = {"packed": "weight_packed", "scale": "weight_scale", "zero": "weight_zero_point"}
    parts = [packed[roles[r]] for r in scheme.roles]
    shapes = companion_shapes(scheme, (37, 96))
    assert {r: tuple(p.shape) for r, p in zip(scheme.roles, parts, strict=True)} == shapes
    assert logical_shape(scheme, tuple(parts[0].shape), packed["weight_shape"].tolist()) == (37, 96)
    got = dequantize(scheme, parts, (37, 96), torch.bfloat16, )
    assert torch.equal(got, oracle.to(torch.bfloat16))


def test_pack_quantized_odd_width_against_formula():
    """in = 72 is not a multiple of the group (compressed-tensors refuses to make it):
    packed by its own packer, checked against (q − 8) · s column by column."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    torch.manual_seed(1)
    q = torch.randint(-8, 8, (5, 72), dtype=torch.int8)
    s = torch.rand(5, 3, dtype=torch.float32) + 0.5
    words = pack_to_int32(q, 4)
    assert tuple(words.shape) == (5, 9)
    assert torch.equal(unpack_ints(words, 4, 72), q.to(torch.int32))
    got = dequantize(Scheme("int", "group", 32), [words, s], (5, 72), torch.float32)
    want = q.float() * s.repeat_interleave(32, 1)[:, :72]
    assert torch.equal(got, want)


def test_nvfp4_matches_compressed_tensors_and_global_scale_divides():
    packed, oracle, _ = ct_compress(_weight(), "nvfp4", "tensor_group", group=16)
    scheme = Scheme("nvfp4", "group", 16)
    parts = [packed["weight_packed"], packed["weight_scale"], packed["weight_global_scale"]]
    got = dequantize(scheme, parts, (40, 96), torch.bfloat16)
    assert torch.equal(got, oracle.to(torch.bfloat16))
    # without the global scale (transformers #48371's MoE path) the values are off by it
    unscaled = dequantize(scheme, parts[:2] + [torch.ones(1)], (40, 96), torch.bfloat16)
    assert not torch.equal(unscaled, got)


def test_nvfp4_odd_width_against_formula():
    torch.manual_seed(2)
    w = torch.randn(3, 40, dtype=torch.bfloat16)  # 40 = 2·16 + 8: a partial last group
    tensors = modelopt_nvfp4(w)
    for divides, glob in ((False, tensors["weight_scale_2"]), (True, 1 / tensors["weight_scale_2"])):
        scheme = Scheme("nvfp4", "group", 16, global_divides=divides)
        parts = [tensors["weight"], tensors["weight_scale"], glob.reshape(1)]
        got = dequantize(scheme, parts, (3, 40), torch.float32)
        assert torch.equal(got, reference(scheme, parts, (3, 40), torch.float32))
    # ModelOpt's weight_scale_2 is the reciprocal of compressed-tensors' global scale
    mo = dequantize(Scheme("nvfp4", global_divides=False), [tensors["weight"],
                    tensors["weight_scale"], tensors["weight_scale_2"]], (3, 40), torch.float32)
    assert (mo - w.float()).abs().max() < 0.5 * w.float().abs().max()


@pytest.mark.parametrize("transpose", [False, True])
def test_mxfp4_matches_transformers(transpose):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    torch.manual_seed(3)
    w = torch.randn(3, 10, 64) * torch.logspace(-3, 3, 10)[None, :, None]
    blocks, scales = mxfp4_encode(w)
    assert tuple(blocks.shape) == (3, 10, 2, 16) and tuple(scales.shape) == (3, 10, 2)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)  # [E, in, out]
    scheme = Scheme("mxfp4", transpose=transpose, source="mxfp4")
    shape = logical_shape(scheme, tuple(blocks.shape))
    got = dequantize(scheme, [blocks, scales], shape, torch.bfloat16)
    assert torch.equal(got, want if transpose else want.transpose(1, 2))
    # the encoder is exact on values that E2M1 · 2^k hold
    assert (got.float() - (w.transpose(1, 2) if transpose else w)).abs().max() <= w.abs().max() / 4


def test_chunks_are_bounded():
    scheme = Scheme("int", "group", 32)
    small = workspace_bytes(scheme, (4096, 4096), chunk_bytes=1 << 20)
    assert small <= 1 << 20
    torch.manual_seed(4)
    q = torch.randint(-8, 8, (64, 64), dtype=torch.int8)
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    parts = [pack_to_int32(q, 4), torch.rand(64, 2) + 0.1]
    from weightplan.planner.core.quant import formats
    whole = dequantize(scheme, parts, (64, 64), torch.float32)
    rows = [(o0, o1) for _, o0, o1, _ in formats.chunks(scheme, parts, (64, 64), chunk_bytes=4096)]
    assert len(rows) > 1 and rows[0][0] == 0 and rows[-1][1] == 64
    assert torch.equal(whole, q.float() * parts[1].repeat_interleave(32, 1))
