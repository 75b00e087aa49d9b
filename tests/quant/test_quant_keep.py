"""Keep-quantized: a model that holds a quantized checkpoint's stored tensors (packed
bytes, scales, zero points, global scales under their own names and dtypes) gets them as
they are, every tensor bit-equal to the file's; the plan's header says it kept them; and
``save`` writes them back bit for bit. Each format, on random small shapes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import weightplan
from tests.hostile.helpers import meta_model  # (a model holding the stored names and dtypes)
from tests.quant.checkpoints import quantized_checkpoint
from tests.quant.makers import mxfp4_encode, write_checkpoint
from tests.quant.test_quant_mxfp4 import gptoss  # noqa: F401 (fixture)

pytest.importorskip("compressed_tensors")

KINDS = {"int": "INT4 pack-quantized", "int-asym": "INT4 pack-quantized",
         "fp8-channel": "FP8 compressed-tensors", "fp8-block": "FP8 compressed-tensors",
         "nvfp4": "NVFP4 compressed-tensors", "modelopt": "NVFP4 ModelOpt"}


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _file_tensors(directory) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        out |= load_file(str(f))
    return out


def keep_round_trip(qdir, out, phrase: str) -> None:
    """Load ``qdir`` into the model of its stored tensors, kept; check every tensor and
    the header; save it to ``out`` and check the files' tensors bit for bit."""
    stored = _file_tensors(qdir)
    model = meta_model(stored)
    plan = weightplan.explain(model, qdir)
    text = str(plan)
    assert not plan.problems and not plan.missing and not plan.unexpected, text
    assert "kept as stored" in text.splitlines()[0] and phrase in text.splitlines()[0], text
    assert "dequantized" not in text.splitlines()[0], text
    plan.execute()
    state = model.state_dict()
    assert sorted(state) == sorted(stored)
    for key, want in stored.items():
        assert state[key].dtype == want.dtype and _bits(state[key]) == _bits(want), key
    weightplan.save(model, out)
    again = _file_tensors(out)
    assert sorted(again) == sorted(stored)
    for key, want in stored.items():
        assert again[key].dtype == want.dtype and tuple(again[key].shape) == tuple(want.shape)
        assert _bits(again[key]) == _bits(want), key


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_keep_quantized_round_trip(tmp_path, kind):
    qdir, _ = quantized_checkpoint(tmp_path, kind)
    keep_round_trip(qdir, tmp_path / "saved", KINDS[kind])


def test_keep_quantized_mxfp4_gptoss(tmp_path, gptoss):  # noqa: F811
    qdir, _ = gptoss
    keep_round_trip(qdir, tmp_path / "saved", "MXFP4")


def test_floating_model_still_dequantizes(tmp_path):
    """A floating parameter under the stored key (compressed-tensors FP8's ``weight``) is
    a dequantize's target, not a keep."""
    qdir, _ = quantized_checkpoint(tmp_path, "fp8-channel")
    model = meta_model({k: (v.to(torch.bfloat16) if v.dtype == torch.float8_e4m3fn else v)
                          for k, v in _file_tensors(qdir).items() if not k.endswith("_scale")})
    text = str(weightplan.explain(model, qdir))
    assert "FP8 compressed-tensors dequantized to bfloat16" in text.splitlines()[0], text


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(experts=st.integers(1, 3), rows=st.integers(1, 5), groups=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_keep_mxfp4_random_shapes(tmp_path_factory, experts, rows, groups, seed):
    torch.manual_seed(seed)
    root = tmp_path_factory.mktemp("mx")
    w = torch.randn(experts, rows * 8, groups * 32) * 2.0 ** torch.randint(-20, 20, (1,)).item()
    blocks, scales = mxfp4_encode(w)
    qdir = write_checkpoint(root / "q", {"m.experts.proj_blocks": blocks,
                                         "m.experts.proj_scales": scales,
                                         "m.norm.weight": torch.randn(4).to(torch.bfloat16)},
                            {"quantization_config": {"quant_method": "mxfp4"}})
    keep_round_trip(qdir, root / "saved", "MXFP4")


def _fused(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What a model with fused experts holds of per-expert stored parts: each role stacked
    over experts, ``gate``/``up`` concatenated along the output dim (dim 1)."""
    import re

    out: dict[str, torch.Tensor] = {}
    experts: dict[tuple[str, str, str], dict[int, torch.Tensor]] = {}
    for key, t in stored.items():
        m = re.fullmatch(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight(.*)", key)
        if m is None:
            out[key] = t
            continue
        experts.setdefault((m[1], m[3], m[4]), {})[int(m[2])] = t
    for (prefix, proj, suffix), by in experts.items():
        stack = torch.stack([by[e] for e in sorted(by)])
        if proj == "down":
            out[f"{prefix}.down_proj{suffix}"] = stack
        elif proj == "gate":
            up = experts[(prefix, "up", suffix)]
            out[f"{prefix}.gate_up_proj{suffix}"] = torch.cat(
                [stack, torch.stack([up[e] for e in sorted(up)])], dim=1)
    return out


@pytest.mark.parametrize("kind", ["int", "int-asym", "fp8-channel", "fp8-block", "nvfp4"])
def test_keep_quantized_through_merges(tmp_path, kind):
    """Per-expert packed parts → a model with fused experts holding each role fused (the
    qwen3_moe mapping: stack, then concatenate gate/up): every tensor bit-equal to the
    stacked file tensors; save writes the per-expert file back bit for bit."""
    qdir, _ = quantized_checkpoint(tmp_path, kind)
    stored = _file_tensors(qdir)
    fused = _fused(stored)
    model = meta_model(fused)
    plan = weightplan.explain(model, qdir, mapping="qwen3_moe")
    text = str(plan)
    assert not plan.problems and not plan.missing and not plan.unexpected, text
    assert "dequantized" not in text.splitlines()[0], text
    count = sum(k.endswith(".weight_scale") for k in stored)  # one per stored weight
    assert f"{count} weight(s) kept as stored" in text.splitlines()[0], text
    plan.execute()
    state = model.state_dict()
    for key, want in fused.items():
        assert state[key].dtype == want.dtype and _bits(state[key]) == _bits(want), key
    weightplan.save(model, tmp_path / "saved")
    again = _file_tensors(tmp_path / "saved")
    assert sorted(again) == sorted(stored)
    for key, want in stored.items():
        assert tuple(again[key].shape) == tuple(want.shape) and _bits(again[key]) == _bits(want), key


def test_modelopt_scalar_scales_cannot_be_concatenated(tmp_path):
    """ModelOpt's ``weight_scale_2`` is a scalar per weight: stacked over experts it is
    ``[E]``, and gate/up can't be concatenated along an output dim it hasn't — a typed
    error at plan time naming the target, not a guess."""
    from weightplan.errors import OpError

    qdir, _ = quantized_checkpoint(tmp_path, "modelopt")
    stored = _file_tensors(qdir)
    fused = _fused({k: v.reshape(1) if v.dim() == 0 else v for k, v in stored.items()})
    with pytest.raises(OpError, match=r"gate_up_proj_scale_2 .*dim 1 is out of range"):
        weightplan.explain(meta_model(fused), qdir, mapping="qwen3_moe")
