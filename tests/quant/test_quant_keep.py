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
    assert f"{count} weights kept as stored" in text.splitlines()[0], text
    plan.execute()
    state = model.state_dict()
    for key, want in fused.items():
        assert state[key].dtype == want.dtype and _bits(state[key]) == _bits(want), key
    weightplan.save(model, tmp_path / "saved")
    again = _file_tensors(tmp_path / "saved")
    assert sorted(again) == sorted(stored)
    for key, want in stored.items():
        assert tuple(again[key].shape) == tuple(want.shape) and _bits(again[key]) == _bits(want), key


def _as_grids(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The experts' ``()`` scalars as ``(1,)`` grids (what merges them; others as they are)."""
    return {k: v.reshape(1) if v.dim() == 0 and ".experts." in k else v for k, v in stored.items()}


def _scale_2_layout(fused: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """The fused model's ``*_scale_2`` as ``layout`` holds them from the ``(E, 2)`` /
    ``(E, 1)`` grid: ``"grid"`` as is, ``"vllm"`` the down one ``(E,)``, ``"scalar"``
    one ``()`` for all."""
    out = dict(fused)
    for key, t in fused.items():
        if key.endswith("_scale_2") and ".experts." in key:
            if layout == "vllm" and t.shape[-1] == 1:
                out[key] = t.reshape(t.shape[0])
            elif layout == "scalar":
                out[key] = t.reshape(-1)[0].clone()
    return out


def _modelopt_keep(tmp_path, qdir, layout: str) -> None:
    """Load ``qdir`` (ModelOpt NVFP4, per expert) into a fused model whose global scales
    follow ``layout``; every tensor bit-equal; save back the per-expert ``()`` scalars."""
    stored = _file_tensors(qdir)
    grid = _fused(_as_grids(stored))
    fused = _scale_2_layout(grid, layout)
    assert any(k.endswith("gate_up_proj_scale_2") for k in fused)
    model = meta_model(fused)
    plan = weightplan.explain(model, qdir, mapping="qwen3_moe")
    text = str(plan)
    assert not plan.problems and not plan.missing and not plan.unexpected, text
    assert "kept as stored" in text.splitlines()[0], text
    plan.execute()
    state = model.state_dict()
    for key, want in fused.items():
        assert tuple(state[key].shape) == tuple(want.shape), key
        assert state[key].dtype == want.dtype and _bits(state[key]) == _bits(want), key
    weightplan.save(model, tmp_path / f"saved-{layout}")
    again = _file_tensors(tmp_path / f"saved-{layout}")
    assert sorted(again) == sorted(stored)
    for key, want in stored.items():
        assert tuple(again[key].shape) == tuple(want.shape), key
        assert again[key].dtype == want.dtype and _bits(again[key]) == _bits(want), key


@pytest.mark.parametrize("layout", ["grid", "vllm"])
def test_modelopt_scale_2_per_expert(tmp_path, layout):
    """ModelOpt's ``weight_scale_2`` is a ``()`` scalar per weight, and the experts' differ:
    merged like their weights, as ``(1,)`` grids, they are ``(E, 2)`` for gate/up and
    ``(E, 1)`` for down (compressed-tensors' fused layout), or ``(E,)`` (vLLM's
    ``w2_weight_scale_2``): each expert's own scalar, loaded and saved back bit for bit."""
    qdir, _ = quantized_checkpoint(tmp_path, "modelopt")
    scales = [v for k, v in _file_tensors(qdir).items() if k.endswith("experts.0.gate_proj.weight_scale_2")
              or k.endswith("experts.1.gate_proj.weight_scale_2")]
    assert len({_bits(v) for v in scales}) > 1  # (the fixture's experts differ)
    _modelopt_keep(tmp_path, qdir, layout)


def _equal_scale_2(tmp_path, qdir):
    """``qdir`` with every expert's ``weight_scale_2`` of a layer set to that layer's
    first one (a checkpoint whose global scales are shared)."""
    import shutil

    from safetensors.torch import save_file

    out = tmp_path / "equal"
    shutil.copytree(qdir, out)
    tensors = _file_tensors(qdir)
    first: dict[str, torch.Tensor] = {}
    for key in sorted(tensors):
        if ".experts." in key and key.endswith("weight_scale_2"):
            layer = key.split(".experts.")[0]
            tensors[key] = first.setdefault(layer, tensors[key]).clone()
    save_file(tensors, str(out / "model.safetensors"))
    return out


def test_modelopt_scale_2_one_for_all_experts(tmp_path):
    """A fused model holding one ``()`` global scale for all experts: loaded when every
    expert's is the same bit for bit (read at plan time), saved back per expert."""
    qdir, _ = quantized_checkpoint(tmp_path, "modelopt")
    _modelopt_keep(tmp_path, _equal_scale_2(tmp_path, qdir), "scalar")


def test_modelopt_scale_2_one_for_all_refused_when_they_differ(tmp_path):
    """The same model on the original checkpoint (the experts' scalars differ): a
    quantization problem naming the target and the tensors, before a byte is loaded;
    ``execute`` refuses it."""
    from weightplan.errors import PlanError

    qdir, _ = quantized_checkpoint(tmp_path, "modelopt")
    stored = _file_tensors(qdir)
    fused = _scale_2_layout(_fused(_as_grids(stored)), "scalar")
    plan = weightplan.explain(meta_model(fused), qdir, mapping="qwen3_moe")
    keys = {p.key for p in plan.problems}
    assert "model.layers.0.mlp.experts.gate_up_proj_scale_2" in keys, str(plan)
    assert "model.layers.1.mlp.experts.down_proj_scale_2" in keys, str(plan)
    text = " ".join(p.message for p in plan.problems)
    assert "experts.0.gate_proj.weight_scale_2=" in text and "differ" in text, text
    with pytest.raises(PlanError):
        plan.execute()
