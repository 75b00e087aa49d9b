"""Dequantize / Quantize node kinds: plan-time inference, workspace bytes, inverses,
errors naming the key."""

import pytest
import torch

from weightplan.errors import QuantizationError
from weightplan.planner.core.quant.blocks import CHUNK_BYTES
from weightplan.planner.core.quant.kinds import Dequantize, Quantize
from weightplan.planner.core.spec import TensorSpec

F8 = torch.float8_e4m3fn


def test_dequantize_infers_the_destination_spec():
    op = Dequantize((128, 128), torch.bfloat16)
    out = op.infer(TensorSpec((4, 320, 256), F8), TensorSpec((4, 3, 2), torch.float32))
    assert out == TensorSpec((4, 320, 256), torch.bfloat16)
    assert str(op) == "dequantize 128×128 → bf16"
    assert op.inverse() == Quantize((128, 128))
    assert hash(op) == hash(Dequantize((128, 128), torch.bfloat16))


@pytest.mark.parametrize("weight, scale, dtype, match", [
    (TensorSpec((192, 256), F8), TensorSpec((1, 2), torch.float32), torch.bfloat16,
     r"scale \[1, 2\] is not the grid \[2, 2\] of weight \[192, 256\]"),
    (TensorSpec((192, 256), torch.bfloat16), TensorSpec((2, 2), torch.float32), torch.bfloat16,
     "needs an FP8 weight"),
    (TensorSpec((192, 256), F8), TensorSpec((2, 2), torch.int32), torch.bfloat16, "scale is"),
    (TensorSpec((192, 256), F8), TensorSpec((2, 2), torch.float32), torch.int8, "destination"),
])
def test_dequantize_refuses_what_does_not_fit(weight, scale, dtype, match):
    with pytest.raises(QuantizationError, match=match) as info:
        Dequantize((128, 128), dtype).infer(weight, scale, key="layers.0.q.weight")
    assert "layers.0.q.weight" in str(info.value)


def test_quantize_infers_weight_and_scale():
    q, s = Quantize((128, 128)).infer(TensorSpec((4, 192, 100), torch.bfloat16))
    assert q == TensorSpec((4, 192, 100), F8) and s == TensorSpec((4, 2, 1), torch.float32)
    assert Quantize().inverse(torch.float16) == Dequantize((128, 128), torch.float16)
    with pytest.raises(QuantizationError, match="rows, cols"):
        Quantize().infer(TensorSpec((256,), torch.bfloat16), key="norm.weight")
    with pytest.raises(QuantizationError, match="bf16/f16/f32"):
        Quantize().infer(TensorSpec((2, 2), F8))
    with pytest.raises(QuantizationError, match="scale_fmt"):
        Quantize(scale_fmt="int8").infer(TensorSpec((2, 2), torch.float32))


def test_workspace_is_one_bounded_chunk():
    big = TensorSpec((18432, 7168), F8)
    ws = Dequantize((128, 128), torch.bfloat16).workspace_bytes(big)
    assert ws <= 2 * CHUNK_BYTES and ws == 8 * 7168 * (CHUNK_BYTES // (4 * 7168 * 128)) * 128
    small = TensorSpec((4, 64, 32), torch.bfloat16)
    assert Quantize().workspace_bytes(small) == 64 * 32 * 4
    assert Quantize().workspace_bytes(TensorSpec((0, 32), torch.bfloat16)) == 0


def test_kernels_round_trip():
    w = torch.randn(2, 192, 64)
    quant = Quantize((128, 128))
    qspec, sspec = quant.infer(TensorSpec.of(w))
    q, s = torch.empty(qspec.shape, dtype=qspec.dtype), torch.empty(sspec.shape)
    quant.run(w, q, s)
    back = torch.empty(w.shape)
    quant.inverse(torch.float32).run(q, s, back)
    assert torch.allclose(back, w, rtol=2 ** -4, atol=s.max().item() * 2 ** -9)
