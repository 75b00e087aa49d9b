"""Dequantization: ceil blocks, bit for bit transformers where it is right, chunked, into
strided destinations, e8m0 scales, 3-D experts."""

import math

import pytest
import torch

from tests.fp8.checkpoints import ref_dequant, ref_quant
from tests.fp8.oracle import bits, hf_dequantize
from weightplan.planner.core.quant.blocks import (
    decode_scales, dequantize, dequantize_into, grid_fits, rows_per_chunk, scale_grid,
    workspace_bytes,
)

E8M0 = getattr(torch, "float8_e8m0fnu", None)


def random_fp8(shape, block=(128, 128), seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(shape, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(scale_grid(shape, block), generator=g) * 1e-2 + 1e-4
    return q, s


def test_grid_is_the_ceil_grid():
    assert scale_grid((192, 256), (128, 128)) == (2, 2)
    assert scale_grid((576, 7168), (128, 128)) == (5, 56)
    assert scale_grid((4, 320, 64), (128, 128)) == (4, 3, 1)
    assert scale_grid((7, 96), (1, 32)) == (7, 3)
    assert scale_grid((7, 96), None) == (1, 1)
    assert grid_fits((192, 256), (2, 2), (128, 128))
    assert not grid_fits((192, 256), (1, 2), (128, 128))
    assert not grid_fits((192,), (2,), (128, 128))
    assert grid_fits((7, 96), (), None) and grid_fits((7, 96), (1,), None)


@pytest.mark.parametrize("shape", [(256, 256), (4, 256, 384), (384, 64), (100, 96), (256, 100)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_bit_exact_with_transformers_where_it_is_right(shape, dtype):
    """Multiples of 128, or a single partial block in a dim (transformers derives the
    block from the grid, which is right exactly then)."""
    q, s = random_fp8(shape)
    got = dequantize(q, s, (128, 128), dtype)
    assert torch.equal(bits(got), bits(ref_dequant(q, s, dtype=dtype)))
    expected = hf_dequantize(q, s, dtype)
    if expected is not None:
        assert expected.dtype == dtype
        assert torch.equal(bits(got), bits(expected))


@pytest.mark.parametrize("shape", [(192, 256), (320, 256), (576, 384), (128, 200), (4, 320, 200)])
def test_ceil_semantics_where_transformers_is_wrong(shape):
    """192 rows / 2 scale rows: transformers uses blocks of 96; 320/3 and 576/5 it refuses.
    Scale row i covers rows [128 i, 128 i + 128)."""
    q, s = random_fp8(shape)
    got = dequantize(q, s, (128, 128), torch.float32)
    assert torch.equal(got, ref_dequant(q, s, dtype=torch.float32))
    rows = shape[-2]
    last = (rows - 1) // 128
    assert torch.equal(got[..., rows - 1, 0], q[..., rows - 1, 0].float() * s[..., last, 0])
    assert torch.equal(got[..., 127, 0], q[..., 127, 0].float() * s[..., 0, 0])


def test_chunked_equals_whole_and_workspace_is_bounded():
    q, s = random_fp8((4, 640, 300))
    whole = dequantize(q, s, (128, 128), torch.bfloat16)
    chunk = 128 * 300 * 4  # one block row per chunk
    assert rows_per_chunk((640, 300), (128, 128), chunk) == 128
    assert workspace_bytes((4, 640, 300), (128, 128), chunk) == chunk
    assert torch.equal(dequantize(q, s, (128, 128), torch.bfloat16, chunk_bytes=chunk), whole)
    assert torch.equal(dequantize(q, s, (128, 128), torch.bfloat16, chunk_bytes=1), whole)
    assert workspace_bytes((64, 300), (128, 128)) == 64 * 300 * 4  # never more than the matrix


def test_writes_into_strided_destinations():
    """The slice of a merged parameter: rows of a gate_up, columns of a concatenation, a
    transposed view."""
    q, s = random_fp8((3, 256, 160))
    expected = ref_dequant(q, s)
    merged = torch.zeros(3, 512, 160, dtype=torch.bfloat16)
    dequantize_into(q, s, merged[:, 256:], (128, 128))
    assert torch.equal(merged[:, 256:], expected) and not merged[:, :256].any()
    wide = torch.zeros(3, 256, 480, dtype=torch.bfloat16)
    dequantize_into(q, s, wide[:, :, 160:320], (128, 128), chunk_bytes=1)
    assert torch.equal(wide[:, :, 160:320], expected)
    transposed = torch.zeros(3, 160, 256, dtype=torch.bfloat16)
    dequantize_into(q, s, transposed.transpose(1, 2), (128, 128))
    assert torch.equal(transposed.transpose(1, 2), expected)


def test_destination_must_fit():
    q, s = random_fp8((128, 128))
    with pytest.raises(ValueError, match="destination"):
        dequantize_into(q, s, torch.empty(128, 127), (128, 128))


@pytest.mark.parametrize("as_dtype", ["uint8", "e8m0"])
def test_e8m0_scales_as_transformers_decodes_them(as_dtype):
    if as_dtype == "e8m0" and E8M0 is None:
        pytest.skip("this torch has no float8_e8m0fnu")  # torch < 2.7; uint8 covers the math
    g = torch.Generator().manual_seed(1)
    q = (torch.randn(64, 96, generator=g) * 10).to(torch.float8_e4m3fn)
    raw = torch.randint(110, 140, (64, 3), generator=g, dtype=torch.uint8)
    scales = raw if as_dtype == "uint8" else raw.view(E8M0)
    assert torch.equal(decode_scales(scales), torch.pow(2.0, raw.float() - 127))
    got = dequantize(q, scales, (1, 32), torch.bfloat16)
    assert torch.equal(got, ref_dequant(q, torch.pow(2.0, raw.float() - 127), (1, 32)))
    expected = hf_dequantize(q, scales, torch.bfloat16)
    if expected is not None:
        assert torch.equal(bits(got), bits(expected))


def test_per_tensor_scale():
    q, _ = random_fp8((40, 24))
    for s in (torch.tensor(0.5), torch.tensor([0.5]), torch.tensor([[0.5]])):
        assert torch.equal(dequantize(q, s, None, torch.float32), q.float() * 0.5)


def test_quantized_fixture_weight_round_trips_within_fp8_precision():
    w = torch.randn(192, 256)
    q, s = ref_quant(w)
    back = dequantize(q, s, (128, 128), torch.float32)
    tile = torch.zeros(2, 2)
    for i in range(2):
        for j in range(2):
            tile[i, j] = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].abs().max()
    step = (tile / 448).repeat_interleave(128, 0)[:192].repeat_interleave(128, 1)
    assert ((back - w).abs() <= w.abs() * 2 ** -4 + step * 2 ** -6).all()
    assert math.isclose(back.abs().max().item(), w.abs().max().item(), rel_tol=1e-6)


def test_regions_of_a_weight_dequantize_with_the_weights_scales():
    """A read of part of a weight (a Chunk piece, a shard): rows and columns that start
    mid-block take the scales of the blocks they lie in."""
    q, s = random_fp8((3, 320, 300))
    full = ref_dequant(q, s, dtype=torch.float32)
    for lead, rows, cols in ((slice(0, 3), slice(0, 320), slice(0, 300)),
                             (slice(1, 3), slice(100, 260), slice(70, 299)),
                             (slice(2, 3), slice(127, 129), slice(255, 257))):
        region = q[lead, rows, cols]
        out = torch.empty(region.shape)
        dequantize_into(region, s, out, (128, 128), origin=(lead.start, rows.start, cols.start),
                        full_shape=q.shape, chunk_bytes=1)
        assert torch.equal(out, full[lead, rows, cols])
