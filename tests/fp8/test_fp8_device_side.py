"""Where FP8 dequantizes run: on the destination device when it is a GPU (the FP8 bytes
and scale tiles copied, dequantized there), on the host otherwise, or forced either way.
Without CUDA here: the placement is planned in dry runs naming cuda devices, the device
path runs with the CPU standing in for the device, and its kernel is checked on CPU
tensors against the reference dequantization."""

import json

import pytest
import torch
from safetensors.torch import load_file

import weightplan
from weightplan.errors import PlanError
from weightplan.executor.dequant import dequantize_on_device
from weightplan.planner.core.quant.blocks import DEQUANTIZE_BYTES, workspace_bytes
from weightplan.planner.core.quant.quantize import quantize
from weightplan.planner.tensors.schedule.dequant_side import DEVICE, HOST

from tests.fp8.checkpoints import ref_dequant
from tests.fp8.test_fp8_interop import meta_model

ON_GPU = {"cuda:0": "80GiB", "cpu": "1GiB"}
BF16 = torch.bfloat16


def fp8_weights(fp8_dir) -> dict[str, torch.Tensor]:
    tensors = load_file(str(fp8_dir / "model.safetensors"))
    return {k: v for k, v in tensors.items() if v.dtype == torch.float8_e4m3fn}


def test_auto_dequantizes_on_a_gpu_destination(fp8_checkpoints):
    _, fp8_dir = fp8_checkpoints("llama")
    plan = weightplan.explain(meta_model("llama"), fp8_dir, device_map="auto",
                              max_memory=ON_GPU, dtype=BF16)
    sides = plan.options.dequantize
    weights = fp8_weights(fp8_dir)
    assert {s.key for s in sides.sites} == set(weights)
    assert all(s.side == DEVICE and s.device == "cuda:0" for s in sides.sites)
    # the host holds the FP8 bytes (1 a value) and the tiles; the device gets bf16
    fp8 = sum(w.numel() for w in weights.values())
    assert sides.bytes_on(DEVICE, "fp8_bytes") == fp8
    assert sides.bytes_on(DEVICE, "out_bytes") == 2 * fp8
    assert sides.bytes_on(DEVICE, "bus_bytes") == fp8 + sides.bytes_on(DEVICE, "scale_bytes")
    gpu = next(u for u in plan.options.placement.uses if u.device == "cuda:0")
    model = meta_model("llama")
    model_bytes = sum(p.numel() * 2 for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers())  # (buffers keep their fp32)
    assert gpu.weights == model_bytes  # bf16 on the device, not the FP8 bytes
    steps = [s for s in plan.schedule.steps if s.device_dequantize]
    assert len(steps) == len(weights)
    # the device's staging: the largest concurrent FP8 region + tiles + fp32 workspace
    staged = sorted(r.region.numel + r.scale_bytes
                    + workspace_bytes(r.region.shape, r.dequantize.block,
                                      per_element=DEQUANTIZE_BYTES)
                    for s in steps for r in s.reads)
    assert gpu.staging == sum(staged[-plan.schedule.threads:])
    text = str(plan)
    assert f"{len(weights)} on the device (cuda:0)" in text and "host → device" in text
    data = json.loads(json.dumps(plan.to_dict()))["dequantize"]
    assert data["sides"]["device"]["count"] == len(weights) and data["sides"]["host"]["count"] == 0
    assert data["tensors"]["model.layers.0.mlp.up_proj.weight"] == {"side": "device",
                                                                    "device": "cuda:0"}


def test_forced_host_copies_bf16_over_the_bus(fp8_checkpoints):
    _, fp8_dir = fp8_checkpoints("llama")
    plan = weightplan.explain(meta_model("llama"), fp8_dir, device_map="auto",
                              max_memory=ON_GPU, dequantize_on="host", dtype=BF16)
    sides = plan.options.dequantize
    assert all(s.side == HOST for s in sides.sites)
    assert not any(s.device_dequantize for s in plan.schedule.steps)
    assert sides.bytes_on(HOST, "bus_bytes") == sides.bytes_on(HOST, "out_bytes") \
        == 2 * sides.bytes_on(HOST, "fp8_bytes")
    assert f"{len(sides.sites)} on the host (for cuda:0)" in str(plan)


def test_each_destination_takes_its_devices_side(fp8_checkpoints):
    _, fp8_dir = fp8_checkpoints("llama")
    model = meta_model("llama")
    plan = weightplan.explain(model, fp8_dir, device_map="sequential",
                              max_memory={"cuda:0": "5MiB", "cpu": "1GiB"}, dtype=BF16)
    placement = plan.options.placement
    sides = {s.key: s for s in plan.options.dequantize.sites}
    assert {s.device for s in sides.values()} == {"cuda:0", "cpu"}  # the map splits them
    for key, site in sides.items():
        assert site.device == placement.device_of(key)
        assert site.side == (DEVICE if site.device == "cuda:0" else HOST), key
        assert site.bus_bytes == (site.fp8_bytes + site.scale_bytes if site.side == DEVICE
                                  else 0)


def test_a_cpu_load_is_on_the_host_and_prints_as_before(fp8_checkpoints):
    _, fp8_dir = fp8_checkpoints("llama")
    plan = weightplan.explain(meta_model("llama"), fp8_dir)
    assert all(s.side == HOST for s in plan.options.dequantize.sites)
    assert "dequantize (FP8" not in str(plan) and "dequantize" not in plan.to_dict()
    with pytest.raises(PlanError, match="dequantize_on='gpu'"):
        weightplan.explain(meta_model("llama"), fp8_dir, dequantize_on="gpu")


def test_the_device_path_loads_what_the_host_path_loads(fp8_checkpoints):
    _, fp8_dir = fp8_checkpoints("mixtral")  # experts: several dequantizes into one tensor
    host, device = meta_model("mixtral"), meta_model("mixtral")
    weightplan.explain(host, fp8_dir).execute(progress=False)
    plan = weightplan.explain(device, fp8_dir, dequantize_on="device")
    sided = [s for s in plan.schedule.steps if s.device_dequantize]
    assert sided and any(len(s.reads) > 1 for s in sided)  # merged experts go device-side too
    assert "on the device (cpu)" in str(plan)
    plan.execute(progress=False)
    for (name, a), (_, b) in zip(host.state_dict().items(), device.state_dict().items(),
                                 strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name


@pytest.mark.parametrize("shape,block", [((256, 384), (128, 128)), ((200, 130), (128, 128)),
                                         ((64, 96), None)])
def test_device_kernel_on_cpu_tensors(shape, block):
    torch.manual_seed(0)
    w = torch.randn(shape) * 3
    q, s = quantize(w, block, scale_fmt="float")
    expected = ref_dequant(q, s, block or shape)
    merged = torch.full((2, *shape), float("nan"), dtype=torch.bfloat16)
    dequantize_on_device(q, s, merged[1], block, (0, 0), shape)  # a slice of a bigger tensor
    assert torch.equal(merged[1], expected) and merged[0].isnan().all()
    # a region of the weight (rows 64.. of it), against the whole weight's scale grid
    rows = torch.empty(shape[0] - 64, shape[1], dtype=torch.bfloat16)
    dequantize_on_device(q[64:], s, rows, block, (64, 0), shape)
    assert torch.equal(rows, expected[64:])


def test_from_pretrained_takes_the_side(fp8_checkpoints, monkeypatch):
    """``from_pretrained(dequantize_on=...)`` plans as ``explain`` does: ``"device"`` runs
    the device kernel (the CPU standing in), ``"host"`` never does; both load the same."""
    import weightplan.executor.dequant as dequant
    from weightplan.errors import ArgumentError

    _, fp8_dir = fp8_checkpoints("mixtral")
    calls = []
    kernel = dequant.dequantize_on_device
    monkeypatch.setattr(dequant, "dequantize_on_device",
                        lambda *a, **k: (calls.append(a[2].shape), kernel(*a, **k))[1])
    host = weightplan.from_pretrained(fp8_dir, dequantize=True, dequantize_on="host",
                                      progress=False)
    assert not calls
    device = weightplan.from_pretrained(fp8_dir, dequantize=True, dequantize_on="device",
                                        progress=False)
    assert len(calls) == len(fp8_weights(fp8_dir))  # each FP8 weight, on the device side
    got, expected = device.state_dict(), host.state_dict()
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
    with pytest.raises(PlanError, match="dequantize_on='gpu'"):  # before anything is built
        weightplan.from_pretrained(fp8_dir, dequantize=True, dequantize_on="gpu")
    with pytest.raises(ArgumentError, match="keeps the quantized weights"):
        weightplan.from_pretrained(fp8_dir, dequantize_on="device",
                                   dequantize=False)  # nothing dequantized


def test_the_cli_shows_the_side(fp8_checkpoints, capsys):
    from weightplan.cli import main

    _, fp8_dir = fp8_checkpoints("llama")
    main(["explain", str(fp8_dir), "--dequantize", "--dequantize-on", "device",
          "--allow-problems"])
    assert "on the device (cpu)" in capsys.readouterr().out
    main(["explain", str(fp8_dir), "--dequantize", "--allow-problems", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert "dequantize" not in data  # auto onto the CPU: on the host, shown as before
    main(["explain", str(fp8_dir), "--dequantize", "--dequantize-on", "host",
          "--device-map", "auto", "--max-memory", "cuda:0=80GiB,cpu=1GiB", "--json",
          "--allow-problems"])
    sides = json.loads(capsys.readouterr().out)["dequantize"]["sides"]
    assert sides["host"]["count"] > 0 and sides["device"]["count"] == 0
