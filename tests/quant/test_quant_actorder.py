"""Act-order pack-quantized (GPTQ's ``weight_g_idx``): column ``i`` takes group
``g_idx[i]``'s scale and zero point. compressed-tensors 0.20 no longer decompresses
``g_idx`` (its ``actorder: group`` was removed), so the oracle is the formula, element by
element, on codes packed by compressed-tensors' own packer; symmetric and asymmetric,
random permutations, in not a multiple of the group."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import weightplan
from tests.conftest import module_with
from tests.quant.makers import write_checkpoint

pytest.importorskip("compressed_tensors")


def _config(symmetric: bool, actorder: object = "group") -> dict:
    return {"quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"g": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
            "symmetric": symmetric, "actorder": actorder}}}}}


def _checkpoint(root, out: int, n: int, symmetric: bool, seed: int):
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    g = torch.Generator().manual_seed(seed)
    groups = -(-n // 32)
    q = torch.randint(-8, 8, (out, n), generator=g, dtype=torch.int8)
    s = (torch.rand(out, groups, generator=g) + 0.25).to(torch.bfloat16)
    g_idx = (torch.arange(n) // 32)[torch.randperm(n, generator=g)].to(torch.int32)
    tensors = {"a.weight_packed": pack_to_int32(q, 4), "a.weight_scale": s,
               "a.weight_shape": torch.tensor([out, n]), "a.weight_g_idx": g_idx}
    z = torch.zeros(out, groups, dtype=torch.int8)
    if not symmetric:
        z = torch.randint(-8, 8, (out, groups), generator=g, dtype=torch.int8)
        tensors["a.weight_zero_point"] = _packed_zero(z)
    want = torch.empty(out, n, dtype=torch.float64)
    for r in range(out):
        for c in range(n):
            k = int(g_idx[c])
            value = torch.tensor((int(q[r, c]) - int(z[r, k])) * float(s[r, k]),
                                 dtype=torch.float32)
            want[r, c] = float(value.to(torch.bfloat16))  # (computed in the scale's dtype)
    return write_checkpoint(root, tensors, _config(symmetric)), want.to(torch.bfloat16)


def _packed_zero(z: torch.Tensor) -> torch.Tensor:
    """Zero points packed along ``out`` (compressed-tensors' layout: ``(⌈out/8⌉, groups)``)."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    return pack_to_int32(z.T.contiguous(), 4).T.contiguous()


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(out=st.integers(1, 20), n=st.integers(1, 100), symmetric=st.booleans(),
       seed=st.integers(0, 2**16))
def test_act_order_equals_the_formula(tmp_path_factory, out, n, symmetric, seed):
    root = tmp_path_factory.mktemp("act")
    directory, want = _checkpoint(root / "c", out, n, symmetric, seed)
    model = module_with({"a.weight": ((out, n), torch.bfloat16)})
    plan = weightplan.explain(model, directory)
    assert not plan.problems and not plan.unexpected and not plan.missing, str(plan)
    assert "act-order g_idx" in str(plan)
    plan.execute()
    assert torch.equal(model.a.weight.view(torch.int16), want.view(torch.int16))


def test_act_order_config_without_g_idx_is_a_problem(tmp_path):
    directory, _ = _checkpoint(tmp_path / "c", 4, 64, True, 0)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(directory / "model.safetensors"))
    del tensors["a.weight_g_idx"]
    save_file(tensors, str(directory / "model.safetensors"))
    plan = weightplan.explain(module_with({"a.weight": ((4, 64), torch.bfloat16)}), directory)
    assert any("needs a.weight_g_idx" in p.message for p in plan.problems), str(plan)


def test_g_idx_naming_a_missing_group_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from weightplan.errors import QuantizationError

    directory, _ = _checkpoint(tmp_path / "c", 4, 64, True, 0)
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["a.weight_g_idx"][3] = 7
    save_file(tensors, str(directory / "model.safetensors"))
    with pytest.raises(QuantizationError, match="names group 7"):
        weightplan.load(module_with({"a.weight": ((4, 64), torch.bfloat16)}), directory)
