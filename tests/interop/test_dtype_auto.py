"""``dtype="auto"`` like transformers: the config's (or checkpoint's) dtype, float32 kept
where the model keeps it, plan sizes in the dtype written."""

import pytest
import torch

import weightplan
from weightplan.cli import main
from weightplan.units import format_bytes

from tests.interop.matrix import FAMILIES, build, output, pretrained


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])  # deepseek keeps fp32 modules
def test_auto_loads_a_bf16_checkpoint_as_from_pretrained_does(family, tmp_path):
    cls, cfg, inputs = FAMILIES[family]()
    torch.manual_seed(0)
    cls(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    reference = pretrained(cls, tmp_path, dtype="auto")
    model = build(cls, cfg, "meta")  # built in float32
    plan = weightplan.explain(model, tmp_path, dtype="auto")
    assert plan.options.dtype == torch.bfloat16
    bf16_bytes = sum(p.numel() * p.element_size() for p in reference.parameters())
    header = str(plan).splitlines()[0]
    assert header.endswith(f"({len(plan.model_info.unique())} tensors, "
                           f"{format_bytes(bf16_bytes)} in bfloat16)"), header
    plan.execute(strict=True)
    got, expected = model.state_dict(), reference.state_dict()
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
    if family == "deepseek_v3":
        assert model.model.layers[1].mlp.gate.weight.dtype == torch.float32
    assert torch.equal(output(model, inputs), output(reference, inputs))


def test_auto_without_a_config_dtype_takes_the_checkpoints(tmp_path):
    state = {"weight": torch.ones(2, 2, dtype=torch.float16), "bias": torch.ones(2)}
    with torch.device("meta"):
        model = torch.nn.Linear(2, 2)
    plan = weightplan.explain(model, {**state, "bias": state["bias"].half()}, dtype="auto")
    assert plan.options.dtype == torch.float16
    plan.execute()
    assert model.weight.dtype == torch.float16


def test_the_cli_explains_in_the_checkpoints_dtype(tmp_path, capsys):
    cls, cfg, _ = FAMILIES["llama"]()
    cls(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    assert main(["explain", str(tmp_path)]) == 0
    assert "in bfloat16)" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3", "deepseek_v3", "whisper"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, "auto"])
def test_buffers_and_parameters_take_the_dtype_transformers_builds_them_in(family, dtype,
                                                                           tmp_path):
    """transformers builds the model under torch's default dtype set to the load's: a buffer
    made in the default dtype holds it (Gemma 3's embed_scale, rounded), one made in float32
    stays float32 (rotary inv_freq); float32 kept where the model keeps it (deepseek)."""
    cls, cfg, inputs = FAMILIES[family]()
    torch.manual_seed(0)
    saved = cls(cfg)
    (saved.to(torch.bfloat16) if dtype == "auto" else saved).save_pretrained(tmp_path)
    reference = pretrained(cls, tmp_path, dtype=dtype)
    model = weightplan.from_pretrained(tmp_path, dtype=dtype)
    theirs = dict(reference.named_buffers()) | dict(reference.named_parameters())
    ours = dict(model.named_buffers()) | dict(model.named_parameters())
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name
    inputs = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in inputs.items()}
    assert torch.equal(output(model, inputs), output(reference, inputs))
