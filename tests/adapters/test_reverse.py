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
