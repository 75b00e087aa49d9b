"""``device=``: each tensor is loaded straight onto its device (CPU here; CUDA where
there is CUDA, through pinned staging buffers)."""

import pytest
import torch

import weightplan
from weightplan.planner.inputs.device import CPU, parse_device
from weightplan.planner.tensors.schedule.device_plan import staging_of
from weightplan.errors import PlanError
from weightplan.units import format_bytes

from tests.interop.matrix import FAMILIES, build, output, pretrained

CUDA = torch.cuda.is_available()


def test_device_maps_pick_the_longest_whole_prefix():
    devices = parse_device({"model.layers.1": "cpu", "model": torch.device("cpu"), "": "cpu"})
    assert devices.device_for("model.layers.1.mlp.weight") == CPU
    assert parse_device(torch.device("cpu")).device_for("anything") == CPU
    assert parse_device({"lm_head": "cpu"}).device_for("lm_head_2.weight") == CPU  # default
    assert parse_device(None) is None


@pytest.mark.parametrize("bad, message", [
    ("gpu:7", "not a device"), (3.5, "must be a device string"), ("meta", "keeps nothing"),
    ({1: "cpu"}, "module prefixes")])
def test_bad_devices_are_refused_at_explain(bad, message):
    with pytest.raises(PlanError, match=message):
        weightplan.explain(torch.nn.Linear(2, 2), {"weight": torch.zeros(2, 2)}, device=bad)


@pytest.mark.skipif(CUDA, reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_says_so():
    with pytest.raises(PlanError, match="CUDA is not available"):
        parse_device("cuda:1")


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), {"model.layers.0": "cpu", "": "cpu"}])
def test_meta_to_cpu_loads_like_from_pretrained(device, tmp_path):
    cls, cfg, inputs = FAMILIES["gemma2"]()
    torch.manual_seed(0)
    cls(cfg).save_pretrained(tmp_path)
    reference = pretrained(cls, tmp_path, dtype=torch.float32)
    model = build(cls, cfg, "meta")
    plan = weightplan.explain(model, tmp_path, device=device)
    assert f"devices: cpu {format_bytes(plan.model_bytes)}" in str(plan)
    plan.execute(strict=True)
    assert all(t.device == CPU for t in [*model.parameters(), *model.buffers()])
    assert torch.equal(output(model, inputs), output(reference, inputs))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_meta_to_cuda_loads_every_tensor_onto_the_device(family, tmp_path):
    cls, cfg, inputs = FAMILIES[family]()
    torch.manual_seed(0)
    cls(cfg).save_pretrained(tmp_path)
    reference = pretrained(cls, tmp_path, dtype=torch.float32)
    for convention in ("meta", "init_empty"):
        model = build(cls, cfg, convention)
        weightplan.load(model, tmp_path, device="cuda:0", strict=True, dtype=torch.bfloat16)
        assert all(t.device.type == "cuda" for t in [*model.parameters(), *model.buffers()])
        for key, value in reference.state_dict().items():
            got = model.state_dict()[key]
            assert torch.equal(got.cpu(), value.to(got.dtype)), key
        model.to(torch.float32)
        cuda_inputs = {k: v.cuda() for k, v in inputs.items()}
        assert torch.allclose(output(model, cuda_inputs).cpu(), output(reference, inputs),
                              atol=0.05)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_a_device_map_splits_the_model(tmp_path):
    cls, cfg, _ = FAMILIES["llama"]()
    cls(cfg).save_pretrained(tmp_path)
    model = build(cls, cfg, "meta")
    plan = weightplan.explain(model, tmp_path, device={"model.layers": "cuda:0", "": "cpu"})
    report = plan.execute()
    assert model.model.layers[0].mlp.up_proj.weight.device.type == "cuda"
    # the pinned buffers the copies went through: within the plan's pool, itself within the
    # bytes that went to the GPU (was up to 8 × 32 MiB for any model)
    pool = staging_of(plan.schedule.steps, plan.options.devices)
    assert 0 < report.staging_bytes <= pool.nbytes <= report.device_bytes["cuda:0"]
    assert model.lm_head.weight.device == CPU and model.model.embed_tokens.weight.device == CPU


def test_a_cuda_index_past_the_devices_counts_them_in_words(monkeypatch):
    """Was: 'this machine has 1 CUDA device(s)'."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(PlanError) as e:
        weightplan.explain(torch.nn.Linear(2, 2), {"weight": torch.zeros(2, 2)}, device="cuda:3")
    assert str(e.value).endswith("but this machine has 1 CUDA device"), str(e.value)
