"""The plan's peak against the machine's memory, and the bounded read-ahead window."""

import torch

import weightplan
from weightplan.planner.tensors.schedule import machine
from weightplan.planner.tensors.schedule.budget import machine_fit
from weightplan.planner.tensors.schedule.machine import (
    Fit, MachineMemory, default_window_bytes, machine_memory,
)

from tests.conftest import expected_moe, moe_model

GIB = 1024**3


def test_meminfo_is_parsed_and_sysconf_is_the_fallback(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384 kB\nMemFree:  1024 kB\nMemAvailable:   8192 kB\n")
    assert machine_memory(str(meminfo)) == MachineMemory(16384 * 1024, 8192 * 1024)
    fallback = machine_memory(str(tmp_path / "absent"))
    assert fallback is not None and fallback.total >= fallback.available > 0


def test_a_model_larger_than_the_machine_is_said_plainly():
    fit = Fit(peak=1300 * GIB, model=1250 * GIB, memory=MachineMemory(32 * GIB, 20 * GIB))
    text = fit.describe()
    assert fit.fits is False and "DOES NOT FIT" in text and "no budget can load it" in text
    assert "1.22 TiB" in text and "20 GiB available" in text


def test_a_peak_over_the_machine_names_the_smallest_budget(moe_dir):
    directory, _ = moe_dir
    plan = weightplan.explain(moe_model(), directory, mapping="mixtral")
    tight = MachineMemory(plan.model_bytes + 1, plan.model_bytes + 1)
    fit = machine_fit(plan.schedule, plan.model_bytes, tight)
    assert fit.fits is False
    assert plan.model_bytes <= fit.minimum <= plan.peak_bytes
    assert "smallest budget that works" in fit.describe() or "smallest any" in fit.describe()
    roomy = machine_fit(plan.schedule, plan.model_bytes, MachineMemory(64 * GIB, 64 * GIB))
    assert roomy.fits and roomy.minimum is None and "fits in memory" in roomy.describe()
    assert "memory" in str(plan).splitlines()[-2] and plan.to_dict()["machine"]["peak_bytes"] \
        == plan.peak_bytes


def test_default_window_is_bounded_not_the_largest_group(moe_dir, monkeypatch):
    assert default_window_bytes(MachineMemory(1 * GIB, GIB)) == 32 * 1024 * 1024
    assert default_window_bytes(MachineMemory(512 * GIB, GIB)) == machine.DEFAULT_WINDOW_BYTES
    monkeypatch.setattr(machine, "DEFAULT_WINDOW_BYTES", 64)
    directory, ckpt = moe_dir
    model = moe_model()
    plan = weightplan.explain(model, directory, mapping="mixtral")
    assert plan.schedule.window_bytes == 64 < max(p.read_bytes for p in plan.schedule.steps)
    plan.execute(progress=False)
    want = expected_moe(ckpt)
    assert all(torch.equal(model.state_dict()[k], want[k]) for k in want)
