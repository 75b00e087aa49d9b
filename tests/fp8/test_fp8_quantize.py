"""Quantization: bit for bit transformers' ``Fp8Quantize``, partial edge tiles as the
zero-padded tile, 3-D experts, ue8m0 scales, chunks, strided outputs."""

import inspect

import pytest
import torch

from tests.fp8.checkpoints import ref_quant
from tests.fp8.oracle import bits, hf_quantize
from weightplan.planner.core.quant.blocks import scale_grid
from weightplan.planner.core.quant.quantize import quantize, quantize_into, tile_amax


def weight(shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g) * torch.logspace(-3, 1, shape[-1])
    w[..., :128, :128] = 0  # one all-zero tile: scale 1
    return w.to(dtype)


@pytest.mark.parametrize("shape", [(256, 256), (4, 256, 384), (128, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_bit_exact_with_transformers(shape, dtype):
    w = weight(shape, dtype)
    q, s = quantize(w, (128, 128))
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert s.shape == scale_grid(shape, (128, 128))
    expected = hf_quantize(w)
    if expected is not None:
        assert torch.equal(bits(q), bits(expected[0])) and torch.equal(bits(s), bits(expected[1]))
    if len(shape) == 2:
        rq, rs = ref_quant(w)
        assert torch.equal(bits(q), bits(rq)) and torch.equal(bits(s), bits(rs))


@pytest.mark.parametrize("shape", [(192, 256), (320, 200), (2, 100, 300), (5, 7)])
def test_partial_edge_tiles_are_the_zero_padded_tiles(shape):
    """transformers leaves such weights unquantized; the padded tile is the definition."""
    w = weight(shape)
    q, s = quantize(w, (128, 128))
    grid = scale_grid(shape, (128, 128))
    padded = torch.zeros(*shape[:-2], grid[-2] * 128, grid[-1] * 128, dtype=w.dtype)
    padded[..., : shape[-2], : shape[-1]] = w
    expected = hf_quantize(padded)
    if expected is not None:
        assert torch.equal(bits(q), bits(expected[0][..., : shape[-2], : shape[-1]]))
        assert torch.equal(bits(s), bits(expected[1]))
    if len(shape) == 2:
        rq, rs = ref_quant(w)
        assert torch.equal(bits(q), bits(rq)) and torch.equal(bits(s), bits(rs))


def test_chunks_and_strided_outputs_change_nothing():
    w = weight((3, 320, 200))
    q, s = quantize(w, (128, 128))
    for chunk in (1, 128 * 200 * 4, 10 << 20):
        q2, s2 = quantize(w, (128, 128), chunk_bytes=chunk)
        assert torch.equal(bits(q2), bits(q)) and torch.equal(s2, s)
    merged_q = torch.zeros(3, 640, 200, dtype=torch.float8_e4m3fn)
    merged_s = torch.zeros(3, 6, 2)
    quantize_into(w, merged_q[:, 320:], merged_s[:, 3:], (128, 128))
    assert torch.equal(bits(merged_q[:, 320:]), bits(q)) and torch.equal(merged_s[:, 3:], s)


def test_tile_amax_is_max_abs_per_padded_tile():
    x = torch.randn(300, 200)
    got = tile_amax(x, 128, 128)
    for i in range(3):
        for j in range(2):
            assert got[i, j] == x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].abs().max()


def test_ue8m0_scales():
    e8m0 = getattr(torch, "float8_e8m0fnu", None)
    if e8m0 is None:
        with pytest.raises(ValueError, match="float8_e8m0fnu"):
            quantize(weight((128, 128)), scale_fmt="ue8m0")
        return
    w = weight((256, 384))
    q, s = quantize(w, (128, 128), scale_fmt="ue8m0")
    assert s.dtype == e8m0
    inv = s.float()
    assert torch.equal(inv, torch.pow(2.0, torch.log2(inv)))  # powers of two
    from transformers import FineGrainedFP8Config
    if "scale_fmt" in inspect.signature(FineGrainedFP8Config).parameters:
        expected = hf_quantize(w, scale_fmt="ue8m0")
        assert torch.equal(bits(q), bits(expected[0])) and torch.equal(bits(s), bits(expected[1]))


def test_rejects_bad_outputs_and_format():
    with pytest.raises(ValueError, match="don't fit"):
        quantize_into(weight((128, 128)), torch.empty(128, 128, dtype=torch.float8_e4m3fn),
                      torch.empty(2, 1), (128, 128))
    with pytest.raises(ValueError, match="scale_fmt"):
        quantize(weight((128, 128)), scale_fmt="int8")
