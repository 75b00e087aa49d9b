"""A key loaded through the base-model-prefix fix-up (another head class's checkpoint) is
saved as the loaded model's own checkpoint holds it, where the mapping alone routes that
key the same way; otherwise as the checkpoint held it (which loads back the same way)."""

import torch
from safetensors.torch import load_file
from torch import nn

import weightplan
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.inputs.model_info import inspect_model
from weightplan.planner.keys.route import route_checkpoint


class _Head(nn.Module):
    base_model_prefix = "enc"

    def __init__(self):
        super().__init__()
        self.enc = nn.Module()
        self.enc.y = nn.Linear(2, 2, bias=False)
        self.enc.z = nn.Linear(2, 2, bias=False)


def _routes(state, transforms):
    routing = route_checkpoint(open_checkpoint(state), transforms, inspect_model(_Head()))
    return {r.key: (r.renamed, r.saved_as) for r in routing.routes}


def test_the_fixed_key_is_saved_without_the_fix_where_the_mapping_routes_it_alike():
    state = {"y.weight": torch.ones(2, 2), "x.weight": torch.ones(2, 2)}
    renaming = weightplan.WeightRenaming(r"^x\.", "z.")
    assert _routes(state, [renaming]) == {
        "y.weight": ("enc.y.weight", "enc.y.weight"),  # (the prefix added: its own name)
        # added after the renaming: enc.x.weight isn't renamed, so saved as it was
        "x.weight": ("enc.z.weight", None)}


def test_a_save_writes_the_model_s_own_keys_and_loads_back(tmp_path):
    state = {"y.weight": torch.full((2, 2), 1.0), "z.weight": torch.full((2, 2), 2.0)}
    model = _Head()
    weightplan.load(model, state, strict=True, progress=False)
    weightplan.save(model, tmp_path / "out", progress=False)
    saved = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(saved) == {"enc.y.weight", "enc.z.weight"}
    again = _Head()
    weightplan.load(again, str(tmp_path / "out"), strict=True, progress=False)
    assert torch.equal(again.enc.z.weight, state["z.weight"])
