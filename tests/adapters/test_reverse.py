"""Reverse: an adapter loaded by weightplan is saved back as its file was, bit for bit, in
either layout; a fused tensor without a per-expert form is refused by name."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import weightplan
from weightplan.errors import SaveError

from tests.adapters.builders import MIXTRAL, per_expert_adapter, tiny_model
from tests.adapters.test_experts import _injected

peft = pytest.importorskip("peft")
SLOW = settings(max_examples=6, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _round_trip(model, directory, out) -> None:
    weightplan.explain(model, str(directory)).execute()
    weightplan.save(model, out, adapter_name="default")
    before = load_file(f"{directory}/adapter_model.safetensors")
    after = load_file(f"{out}/adapter_model.safetensors")
    assert set(before) == set(after)
    for k in before:
        assert before[k].dtype == after[k].dtype and torch.equal(before[k], after[k]), k
    assert (out / "adapter_config.json").read_text() != ""


@SLOW
@given(experts=st.integers(1, 5), r=st.integers(1, 4), inter=st.integers(1, 9),
       hidden=st.sampled_from([4, 8, 12]))
def test_per_expert_layout_round_trips(tmp_path_factory, experts, r, inter, hidden):
    root = tmp_path_factory.mktemp("v4")
    sizes = dict(experts=experts, hidden=hidden, inter=inter, layers=1)
    per_expert_adapter(str(root / "in"), MIXTRAL, r=r, **sizes)
    model = _injected("mixtral", str(root / "in"), **sizes)
    _round_trip(model, root / "in", root / "out")


@SLOW
@given(experts=st.integers(1, 5), r=st.integers(1, 4), inter=st.integers(1, 9))
def test_fused_layout_round_trips(tmp_path_factory, experts, r, inter):
    root = tmp_path_factory.mktemp("fused")
    sizes = dict(experts=experts, hidden=8, inter=inter, layers=1)
    config = dict(r=r, lora_alpha=2 * r, target_parameters=["gate_up_proj", "down_proj"])
    trained = peft.get_peft_model(tiny_model("mixtral", **sizes), peft.LoraConfig(
        init_lora_weights=False, **config))
    trained.save_pretrained(root / "in")
    model = peft.get_peft_model(tiny_model("mixtral", **sizes), peft.LoraConfig(**config))
    _round_trip(model, root / "in", root / "out")


def test_non_zero_off_diagonal_is_refused_by_name(tmp_path):
    per_expert_adapter(str(tmp_path / "in"), MIXTRAL)
    model = _injected("mixtral", str(tmp_path / "in"))
    weightplan.explain(model, str(tmp_path / "in")).execute()
    with torch.no_grad():  # gate rows, an up column: off the diagonal
        model.model.layers[1].mlp.experts.base_layer.lora_B["default"].weight[0, -1] = 0.5
    with pytest.raises(SaveError, match=r"layers\.1\.mlp\.experts\.base_layer\.lora_B"):
        weightplan.save(model, tmp_path / "out", adapter_name="default")
    assert not (tmp_path / "out").exists()


def test_an_adapter_not_loaded_by_weightplan_is_refused(tmp_path):
    per_expert_adapter(str(tmp_path / "in"), MIXTRAL)
    with pytest.raises(SaveError, match="not loaded by weightplan"):
        weightplan.save(_injected("mixtral", str(tmp_path / "in")), tmp_path / "out",
                        adapter_name="default")


def _read(directory):
    return load_file(f"{directory}/adapter_model.safetensors")


@SLOW
@given(experts=st.integers(1, 5), r=st.integers(1, 4), inter=st.integers(1, 9),
       hidden=st.sampled_from([4, 8, 12]))
def test_per_expert_saved_fused_and_back_is_exact(tmp_path_factory, experts, r, inter, hidden):
    """per-expert file → load → save fused (peft's own file: its load equals ours) → load
    that → save per-expert: the first file again, bit for bit."""
    import json

    root = tmp_path_factory.mktemp("v4")
    sizes = dict(experts=experts, hidden=hidden, inter=inter, layers=1)
    per_expert_adapter(str(root / "in"), MIXTRAL, r=r, **sizes)
    model = _injected("mixtral", str(root / "in"), **sizes)
    weightplan.explain(model, str(root / "in")).execute()
    weightplan.save(model, root / "fused", adapter_name="default", layout="fused")
    fused = _read(root / "fused")
    assert any(".experts.base_layer.lora_B.weight" in k for k in fused)
    config = json.loads((root / "fused" / "adapter_config.json").read_text())
    assert "gate_up_proj" in config["target_parameters"]
    oracle = peft.PeftModel.from_pretrained(tiny_model("mixtral", **sizes), str(root / "fused"))
    again = peft.PeftModel.from_pretrained(tiny_model("mixtral", **sizes), str(root / "in"))
    theirs, ours = oracle.state_dict(), again.state_dict()
    assert [k for k in ours if ".lora_" in k and not torch.equal(ours[k], theirs[k])] == []
    weightplan.explain(oracle, str(root / "fused")).execute()
    weightplan.save(oracle, root / "back", adapter_name="default", layout="per_expert")
    before, after = _read(root / "in"), _read(root / "back")
    assert set(before) == set(after)
    assert [k for k in before if not torch.equal(before[k], after[k])] == []
    back = json.loads((root / "back" / "adapter_config.json").read_text())
    assert not back.get("target_parameters") and {"w1", "w2", "w3"} <= set(back["target_modules"])


@SLOW
@given(experts=st.integers(1, 5), r=st.integers(1, 4), inter=st.integers(1, 9))
def test_fused_saved_per_expert_and_back_is_exact(tmp_path_factory, experts, r, inter):
    root = tmp_path_factory.mktemp("fused")
    sizes = dict(experts=experts, hidden=8, inter=inter, layers=1)
    config = dict(r=2 * r, lora_alpha=4 * r, target_parameters=["gate_up_proj", "down_proj"])
    model = peft.get_peft_model(tiny_model("mixtral", **sizes), peft.LoraConfig(
        init_lora_weights=False, **config))
    with torch.no_grad():  # a fused pair trained from a per-expert adapter: block-diagonal B
        for layer in model.base_model.model.model.layers:
            b = layer.mlp.experts.base_layer.lora_B["default"].weight
            blocks = b.view(b.shape[0], -1, experts).permute(2, 0, 1)
            blocks[:, :inter, r:] = 0
            blocks[:, inter:, :r] = 0
    model.save_pretrained(root / "in")
    weightplan.explain(model, str(root / "in")).execute()
    weightplan.save(model, root / "v4", adapter_name="default", layout="per_expert")
    assert any(".experts.0.w1.lora_A.weight" in k for k in _read(root / "v4"))
    v4 = _injected("mixtral", str(root / "v4"), **sizes)
    weightplan.explain(v4, str(root / "v4")).execute()
    weightplan.save(v4, root / "out", adapter_name="default", layout="fused")
    before, after = _read(root / "in"), _read(root / "out")
    assert set(before) == set(after)
    assert [k for k in before if not torch.equal(before[k], after[k])] == []


def test_per_expert_layout_refuses_blocks_off_the_diagonal(tmp_path):
    config = dict(r=4, lora_alpha=8, target_parameters=["gate_up_proj", "down_proj"])
    model = peft.get_peft_model(tiny_model("mixtral"), peft.LoraConfig(
        init_lora_weights=False, **config))
    model.save_pretrained(tmp_path / "in")
    weightplan.explain(model, str(tmp_path / "in")).execute()
    with pytest.raises(SaveError, match=r"layers\.0\.mlp\.experts\.base_layer\.lora_B"):
        weightplan.save(model, tmp_path / "out", adapter_name="default", layout="per_expert")
    assert not (tmp_path / "out").exists()
    weightplan.save(model, tmp_path / "fused", adapter_name="default", layout="fused")
    assert set(_read(tmp_path / "fused")) == set(_read(tmp_path / "in"))


def test_two_adapters_each_saved_with_only_its_own_tensors(tmp_path):
    """Two adapters on one model, each loaded from its own directory: saving one writes
    only its tensors (the other's, with peft's prefix too, were written into it)."""
    def two():
        model = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj"], init_lora_weights=False))
        model.add_adapter("second", peft.LoraConfig(r=2, lora_alpha=4, init_lora_weights=False,
                                                    target_modules=["v_proj", "o_proj"]))
        return model

    two().save_pretrained(tmp_path / "in")  # (default at the root, second in a subfolder)
    model = two()
    for name, directory in (("default", tmp_path / "in"), ("second", tmp_path / "in/second")):
        weightplan.explain(model, str(directory), adapter_name=name).execute()
    for name, directory in (("default", tmp_path / "in"), ("second", tmp_path / "in/second")):
        weightplan.save(model, tmp_path / name, adapter_name=name)
        before = load_file(f"{directory}/adapter_model.safetensors")
        after = load_file(f"{tmp_path / name}/adapter_model.safetensors")
        assert sorted(after) == sorted(before)
        assert all(torch.equal(before[k], after[k]) for k in before)


def test_another_adapters_directory_points_at_the_subfolder(tmp_path):
    """peft saves a non-default adapter in a subfolder named after it; the root given with
    adapter_name='second' (the default's file) was said to be 'the adapter of another base
    model?'; the error now names the subfolder."""
    from weightplan.errors import AdapterError

    model = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj"]))
    model.add_adapter("second", peft.LoraConfig(r=2, lora_alpha=4, target_modules=["v_proj"]))
    model.save_pretrained(tmp_path / "in")
    with pytest.raises(AdapterError, match=r"in/second"):
        weightplan.explain(model, str(tmp_path / "in"), adapter_name="second")
