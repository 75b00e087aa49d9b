"""A per-expert (v4) adapter whose linears were trained with different scales
(``alpha_pattern`` / ``rank_pattern`` on the gate and not the up linear, or on one expert)
has no exact fused form: the fused parameter is one LoRA layer with one scale. A problem
naming the layer and the scales, refused by ``execute()`` — it loaded with the gate's scale
for every expert's gate and up halves (the up deltas ×4 off, silently)."""

from __future__ import annotations

import json

import pytest

import weightplan
from weightplan.errors import AdapterError
from weightplan.planner.core.problems import ProblemKind

from tests.adapters.builders import MIXTRAL, per_expert_adapter, tiny_model

peft = pytest.importorskip("peft")


@pytest.mark.parametrize("pattern", [{"w1": 16},
                                     {"model.layers.1.block_sparse_moe.experts.0.w1": 16}])
def test_linears_of_one_fused_layer_trained_with_different_scales(tmp_path, pattern):
    tiny_model("mixtral").save_pretrained(tmp_path / "base")
    d = tmp_path / "v4"
    per_expert_adapter(str(d), MIXTRAL, attention=False)  # r 2, alpha 8: scale 4
    config = json.loads((d / "adapter_config.json").read_text())
    (d / "adapter_config.json").write_text(json.dumps({**config, "alpha_pattern": pattern}))
    with pytest.raises(AdapterError, match=r"gate_up_proj.*different scales.*: [48] .*; [48] .*one scale"):
        weightplan.from_pretrained(tmp_path / "base", adapter=d)


def test_a_scale_pattern_on_a_whole_fused_linear_set_loads(tmp_path):
    tiny_model("mixtral").save_pretrained(tmp_path / "base")
    d = tmp_path / "v4"
    per_expert_adapter(str(d), MIXTRAL, attention=False)
    config = json.loads((d / "adapter_config.json").read_text())
    (d / "adapter_config.json").write_text(json.dumps({**config, "alpha_pattern": {"w2": 16}}))
    model = peft.get_peft_model(tiny_model("mixtral"), peft.LoraConfig(
        r=2, lora_alpha=8, target_parameters=["gate_up_proj", "down_proj"],
        rank_pattern={"gate_up_proj": 4}, alpha_pattern={"gate_up_proj": 16,
                                                         "down_proj": 16}))
    plan = weightplan.explain(model, d)
    assert not [p for p in plan.problems if p.kind is ProblemKind.ADAPTER], plan.problems


def test_a_pattern_on_one_layers_fused_linears_changes_that_layers_scale(tmp_path):
    """Every linear fused into layer 1's gate_up_proj trained at scale 8, layer 0's at 4:
    the fused layer is injected with the linears' default scale, a change to say."""
    tiny_model("mixtral").save_pretrained(tmp_path / "base")
    d = tmp_path / "v4"
    per_expert_adapter(str(d), MIXTRAL, attention=False)
    config = json.loads((d / "adapter_config.json").read_text())
    pattern = {r"model.layers.1.block_sparse_moe.experts.\d+.w[13]": 16}
    (d / "adapter_config.json").write_text(json.dumps({**config, "alpha_pattern": pattern}))
    with pytest.raises(AdapterError, match=r"layers.1.mlp.experts.gate_up_proj.* by 4.*with 8"):
        weightplan.from_pretrained(tmp_path / "base", adapter=d)
