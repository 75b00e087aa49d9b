"""``max_memory={"cpu": 0}`` (everything to the disk, no accelerator): the non-persistent
buffers (rotary ``inv_freq``) are no checkpoint tensors and never go to the disk (accelerate
keeps buffers in memory where the modules run): they are held on the CPU and counted
apart (``DeviceUse.resident``, a note), not against ``max_memory``, not as the CPU's
staging nor the disk's weights (was: ``BudgetError`` "cpu would hold 32 B > its max_memory
0 B")."""

from __future__ import annotations

import pytest
import torch

import weightplan

from tests.adapters.builders import tiny_model

IDS = torch.tensor([[1, 5, 9, 63, 0]])
BUFFERS = ("model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    directory = tmp_path_factory.mktemp("zero") / "base"
    tiny_model("llama").save_pretrained(directory)
    return directory


def test_a_zero_cpu_budget_puts_everything_on_the_disk_and_runs(base, tmp_path):
    from transformers import AutoModelForCausalLM

    from weightplan.bridge.hub import build_empty_model

    model = build_empty_model(base).model
    buffers = sum(model.get_buffer(b).nbytes for b in BUFFERS)
    plan = weightplan.explain(model, base, device_map="auto", max_memory={"cpu": 0},
                              offload_folder=str(tmp_path / "off"))
    uses = {u.device: u for u in plan.options.placement.uses}
    cpu = uses["cpu"]
    assert (cpu.weights, cpu.staging, cpu.resident, cpu.peak) == (0, 0, buffers, buffers)
    assert uses["disk"].weights == plan.checkpoint.nbytes  # (the buffers aren't there)
    notes = [n.message for n in plan.notes if n.key == "buffers"]
    assert len(notes) == 1 and all(b in notes[0] for b in BUFFERS), plan.notes
    assert f"{buffers} B of non-persistent buffers" in notes[0]
    assert "max_memory doesn't count them" in notes[0]
    loaded = weightplan.from_pretrained(base, device_map="auto", max_memory={"cpu": 0},
                                        offload_folder=str(tmp_path / "off2"))
    assert set(loaded.hf_device_map.values()) == {"disk"}
    assert all(loaded.get_buffer(b).device.type == "cpu" for b in BUFFERS)
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(base)(IDS).logits
        assert torch.equal(loaded(IDS).logits, expected)


def test_a_resident_placement_has_no_buffer_note(base):
    from weightplan.bridge.hub import build_empty_model

    plan = weightplan.explain(build_empty_model(base).model, base, device_map="auto",
                              max_memory={"cpu": "1GiB"})
    assert not [n for n in plan.notes if n.key == "buffers"]


def test_a_given_map_on_the_disk_counts_the_buffers_apart_too(base, tmp_path):
    """A dict ``device_map`` putting the model on the disk under ``max_memory={"cpu": 0}``:
    the buffers held as the automatic placement's are (was: ``BudgetError`` "cpu would hold
    32 B > its max_memory 0 B", the buffers in the CPU's staging and the disk's weights)."""
    from transformers import AutoModelForCausalLM

    from weightplan.bridge.hub import build_empty_model

    model = build_empty_model(base).model
    buffers = sum(model.get_buffer(b).nbytes for b in BUFFERS)
    plan = weightplan.explain(model, base, device_map={"": "disk"}, max_memory={"cpu": 0},
                              offload_folder=str(tmp_path / "off"))
    uses = {u.device: u for u in plan.options.placement.uses}
    assert (uses["cpu"].staging, uses["cpu"].resident) == (0, buffers)
    assert uses["disk"].weights == plan.checkpoint.nbytes
    assert [n for n in plan.notes if n.key == "buffers"]
    loaded = weightplan.from_pretrained(base, device_map={"": "disk"}, max_memory={"cpu": 0},
                                        offload_folder=str(tmp_path / "off2"))
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(base)(IDS).logits
        assert torch.equal(loaded(IDS).logits, expected)

