"""The picture says what a reader needs (issue 22, item 7): renames on the edges, the plain
1:1 copies of a big model folded into one counted box, the peak outlined only on a step that
makes it, in words (no ``submit``)."""

import re

import torch

import weightplan
from weightplan.viz.dot import to_dot
from weightplan.viz.style import PEAK_COLOUR

from tests.conftest import module_with, write_checkpoint
from tests.viz.plans import deep_plan, small_plan


def edges(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if "->" in line]


def test_renames_are_written_on_the_edges():
    text = to_dot(small_plan())
    labelled = [e for e in edges(text) if "label=" in e]
    assert any("rename .block_sparse_moe. → .mlp." in e for e in labelled)
    assert any("legacy rename LayerNorm\\\\.gamma$ → LayerNorm.weight" in e for e in labelled)
    assert len(labelled) == 6  # 3 merged read streams, the gate, gamma, beta
    assert not any("label=" in e for e in edges(text) if "Chunk" in e)


def test_a_prefix_move_is_on_its_edge():
    """Llava's language_model.model.* → model.language_model.*: one edge says it."""
    from weightplan import PrefixChange, WeightRenaming

    mapping = [WeightRenaming(r"^language_model\.model\.", "model.language_model.")]
    plan = weightplan.explain(module_with({"model.language_model.norm.weight": ((4,), torch.float32)}),
                              {"language_model.model.norm.weight": torch.ones(4)}, mapping=mapping)
    (edge,) = edges(to_dot(plan))
    assert "rename ^language_model\\\\.model\\\\. → model.language_model." in edge
    assert PrefixChange  # (imported: the other transform a move is written with)


def test_plain_copies_fold_into_one_counted_box():
    plan = small_plan()
    folded = to_dot(plan, fold=True)
    assert "as is ×1: read → assign under the same name" in folded
    assert "1 plain copies in one box" in folded
    assert len(re.findall(r"\bn\d+ \[", folded)) == len(re.findall(r"\bn\d+ \[", to_dot(plan))) - 1
    assert "as is ×" not in to_dot(plan)  # 13 conversions: not folded by default


def test_a_big_plan_folds_by_default_and_unfolds_on_request():
    plan = deep_plan(layers=60, experts=2)  # 303 conversions
    text = to_dot(plan)
    box = next(line for line in text.splitlines() if "as is ×" in line)
    assert "as is ×1:" in box and "model.embed_tokens.weight" in box  # the rest are renamed
    unfolded = to_dot(plan, fold=False)
    assert "as is ×" not in unfolded and "model.embed_tokens.weight\\nread" in unfolded
    assert "as is ×" not in to_dot(plan, only="model.embed*")  # only= draws what it names


def test_the_peak_is_outlined_on_the_step_that_makes_it(tmp_path):
    directory = write_checkpoint(tmp_path / "ckpt", {"a.weight": torch.ones(4),
                                                     "z.weight": torch.ones(64, 1024)})
    model = module_with({"a.weight": ((4,), torch.float32), "z.weight": ((64, 1024), torch.float32)})
    text = to_dot(weightplan.explain(model, directory))
    (peak,) = [line for line in text.splitlines() if "▲ peak" in line]
    assert "z.weight" in peak and PEAK_COLOUR in peak
    assert "submit" not in text and "finalize" not in text
    assert re.search(r"▲ peak \S+ \S+ at step 2/2, while (its reads are in flight|it is assembled)",
                     peak)


def _node_lines(text: str, key: str) -> list[str]:
    """The node lines of the picture whose label starts with ``key``."""
    return [line for line in text.splitlines() if f'[label="{key}\\n' in line]


def test_a_tied_parameter_is_on_its_node():
    """lm_head tied to embed_tokens is loaded once: the picture says so on the node that
    assigns it (was: lm_head.weight appeared nowhere in the picture), and only= finds the
    node by either name."""
    model = module_with({"model.embed_tokens.weight": ((4, 2), torch.float32),
                         "model.norm.weight": ((2,), torch.float32)})
    model.lm_head = torch.nn.Module()
    model.lm_head.weight = model.model.embed_tokens.weight
    plan = weightplan.explain(model, {"model.embed_tokens.weight": torch.ones(4, 2),
                                      "model.norm.weight": torch.ones(2)})
    for text in (to_dot(plan), to_dot(plan, only="lm_head*")):
        (assign,) = [line for line in _node_lines(text, "model.embed_tokens.weight")
                     if "assign" in line]
        assert "\\ntied: lm_head.weight (one tensor)" in assign, assign
    (norm,) = [line for line in _node_lines(to_dot(plan), "model.norm.weight") if "assign" in line]
    assert "tied" not in norm


def test_a_mismatched_key_is_not_said_to_allocate():
    """Nothing is allocated for a shape mismatch (the load refuses it): its node says it is
    not loaded, and what the model has (was: "assign f32[2] · 8 B · allocates")."""
    plan = weightplan.explain(module_with({"norm.weight": ((3,), torch.float32),
                                           "bias": ((2,), torch.float32)}),
                              {"norm.weight": torch.ones(2), "bias": torch.ones(2)})
    text = to_dot(plan)
    (node,) = [line for line in _node_lines(text, "norm.weight") if "assign" in line]
    assert "assign f32[2] · 8 B · not loaded\\nmismatch: the model has f32[3]" in node, node
    assert "allocates" not in node
    (bias,) = [line for line in _node_lines(text, "bias") if "assign" in line]
    assert "· allocates" in bias  # (a tensor the load does allocate)
