"""The explanation is grouped: a 32-layer, 8-expert model is a screenful."""

import torch

import weightplan
from weightplan.viz.folding import fold_keys, fold_tuples, ranges

from tests.conftest import moe_checkpoint, moe_model


def test_ranges_and_folding():
    assert ranges([0, 1, 2, 3, 7]) == "{0..3,7}"
    assert ranges([4]) == "4"
    keys = [f"m.layers.{layer}.experts.{e}.w1" for layer in range(32) for e in range(8)]
    assert fold_keys(keys + ["lm_head.weight"]) == ["lm_head.weight", "m.layers.{0..31}.experts.{0..7}.w1"]


def test_folding_is_exact_for_ragged_sets():
    rows = [(0, 0), (0, 1), (1, 0)]
    assert sorted(fold_tuples(rows)) == [("0", "{0,1}"), ("1", "0")]


def test_32_layers_8_experts_is_a_screenful():
    layers, experts = 32, 8
    ckpt = moe_checkpoint(layers=layers, experts=experts, inter=4, hidden=4)
    plan = weightplan.explain(moe_model(layers=layers, experts=experts, inter=4, hidden=4), ckpt,
                              mapping="mixtral")
    text = str(plan)
    assert len(text.splitlines()) < 40
    assert "model.layers.{0..31}.block_sparse_moe.experts.{0..7}.w1.weight" in text
    assert "→ model.layers.{0..31}.mlp.experts.gate_up_proj" in text
    assert "peak estimate:" in text and "problems: none" in text


def test_problems_are_folded_too():
    ckpt = moe_checkpoint(layers=4)
    ckpt.update({f"extra.{i}.w": torch.ones(1) for i in range(10)})
    plan = weightplan.explain(moe_model(layers=4), ckpt, mapping="mixtral")
    assert "unexpected (10): extra.{0..9}.w" in str(plan)


def test_direct_bytes_are_the_plain_copies():
    from weightplan.viz.text import direct_bytes

    layers, experts = 2, 8
    for dtype in (None, torch.bfloat16):  # plain copies, and reads cast on their way
        plan = weightplan.explain(moe_model(layers=layers, experts=experts, inter=4, hidden=4),
                                  moe_checkpoint(layers=layers, experts=experts, inter=4,
                                                 hidden=4), mapping="mixtral", dtype=dtype)
        direct = sum(direct_bytes(p) for p in plan.schedule.steps)
        assert direct == (plan.read_bytes if dtype is None else 0) and plan.read_bytes > 0
