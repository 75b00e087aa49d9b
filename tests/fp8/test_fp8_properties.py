"""Property tests: dequantize equals the block-by-block reference bit for bit; quantize →
dequantize stays within FP8 precision; quantize is idempotent on its own output; the
scale pairing finds exactly what was written."""

import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.torch import save_file

from tests.fp8.checkpoints import ref_dequant
from tests.fp8.oracle import bits
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.inputs.fp8_pairs import pair_scales, scale_key
from weightplan.planner.inputs.quant_config import QuantConfig
from weightplan.planner.core.quant.blocks import dequantize, scale_grid
from weightplan.planner.core.quant.quantize import quantize

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
blocks = st.sampled_from([(128, 128), (32, 16), (1, 32), (16, 1), (7, 5)])
dims = st.integers(1, 70)
dtypes = st.sampled_from([torch.bfloat16, torch.float16, torch.float32])


@st.composite
def fp8_weights(draw):
    block = draw(blocks)
    lead = draw(st.sampled_from([(), (2,)]))
    shape = lead + (draw(dims), draw(dims))
    seed = draw(st.integers(0, 2 ** 16))
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    q = raw.view(torch.float8_e4m3fn)
    q = torch.where(q.float().isnan(), torch.zeros_like(q.float()), q.float()).to(q.dtype)
    s = torch.exp2(torch.randint(-20, 10, scale_grid(shape, block), generator=g).float())
    s = s * (1 + torch.rand(s.shape, generator=g))
    return q, s, block


@SETTINGS
@given(fp8_weights(), dtypes, st.sampled_from([1, 4096, 1 << 24]))
def test_dequantize_equals_the_reference(case, dtype, chunk):
    q, s, block = case
    got = dequantize(q, s, block, dtype, chunk_bytes=chunk)
    assert torch.equal(bits(got), bits(ref_dequant(q, s, block, dtype)))


@st.composite
def weights(draw):
    block = draw(blocks)
    shape = draw(st.sampled_from([(), (3,)])) + (draw(dims), draw(dims))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))
    scale = 10.0 ** draw(st.integers(-6, 3))
    w = torch.randn(shape, generator=g) * scale
    if draw(st.booleans()):
        w[..., : block[0], : block[1]] = 0
    return w, block


@SETTINGS
@given(weights())
def test_quantize_then_dequantize_stays_within_fp8_precision(case):
    """e4m3 keeps 3 mantissa bits: relative error ≤ 2⁻⁴ for normal values; below the
    smallest normal (2⁻⁶ of the tile's 448-scaled range) the step is 2⁻⁹·s."""
    w, block = case
    q, s = quantize(w, block)
    back = dequantize(q, s, block, torch.float32)
    b0, b1 = block
    step = s.repeat_interleave(b0, -2)[..., : w.shape[-2], :]
    step = step.repeat_interleave(b1, -1)[..., : w.shape[-1]]
    assert ((back - w).abs() <= w.abs() * 2 ** -4 + step * 2 ** -9).all()
    assert (q.float().abs() <= 448).all()


@SETTINGS
@given(weights())
def test_quantize_is_idempotent_on_its_own_output(case):
    """Quantizing a dequantized FP8 weight gives the same bytes back (what makes
    save(quantize="fp8") of an FP8-loaded model reproduce the checkpoint)."""
    w, block = case
    q, s = quantize(w, block)
    q2, s2 = quantize(dequantize(q, s, block, torch.float32), block)
    assert torch.equal(bits(q2), bits(q))
    assert torch.allclose(s2, s, rtol=2 ** -22, atol=0)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["q", "k", "up", "down"]), dims, dims),
                min_size=1, max_size=5, unique_by=lambda t: t[0]),
       st.sets(st.integers(0, 4)))
def test_pairing_finds_what_was_written(tmp_path_factory, layers, unscaled):
    tensors = {}
    for i, (name, rows, cols) in enumerate(layers):
        key = f"model.layers.{i}.{name}.weight"
        q, s = quantize(torch.randn(rows, cols), (32, 16))
        tensors[key] = q
        if i not in unscaled:
            tensors[scale_key(key)] = s
    path = tmp_path_factory.mktemp("pairs")
    save_file(tensors, str(path / "model.safetensors"))
    pairing = pair_scales(open_checkpoint(path).entries, QuantConfig(block=(32, 16)))
    scaled = {k for k in tensors if scale_key(k) in tensors}
    assert set(pairing.pairs) == scaled
    assert {p.key for p in pairing.problems} == {k for k in tensors
                                                 if not k.endswith("_inv") and k not in scaled}
    for key in scaled:
        assert pairing.pairs[key].scale.spec.shape == tensors[scale_key(key)].shape


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.sampled_from([64, 128, 192, 256]), st.sampled_from([64, 128, 200]),
       st.integers(0, 2 ** 16))
def test_revert_of_convert_is_the_fp8_checkpoint(experts, inter, hidden, seed):
    """Per-expert FP8 weights + scales → fused FP8 experts + fused scales → back, bit for
    bit; where a block would straddle gate and up (inter not a whole number of blocks)
    the conversion is refused, never approximated."""
    import pytest

    import weightplan
    from tests.conftest import moe_checkpoint
    from weightplan.errors import QuantizationError

    x = {}
    for key, value in moe_checkpoint(1, experts, inter, hidden, seed=seed).items():
        if "experts" in key:
            x[key], x[key + "_scale_inv"] = quantize(value)
        else:
            x[key] = value
    if inter % 128:
        with pytest.raises(QuantizationError, match="cutting through blocks"):
            weightplan.convert(x, "mixtral")
        return
    y = weightplan.convert(x, "mixtral")
    fused = y["model.layers.0.mlp.experts.gate_up_proj"]
    assert fused.dtype == torch.float8_e4m3fn and fused.shape == (experts, 2 * inter, hidden)
    assert y["model.layers.0.mlp.experts.gate_up_proj_scale_inv"].shape == (
        experts, 2 * inter // 128, -(-hidden // 128))
    z = weightplan.revert(y, "mixtral")
    assert set(z) == set(x)
    assert all(z[k].dtype == x[k].dtype and torch.equal(bits(z[k]), bits(x[k])) for k in x)
