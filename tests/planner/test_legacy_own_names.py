"""The always-applied legacy renames (``weight_g`` / ``weight_v``, the doubled
``.model.model``, ``LayerNorm.gamma``) leave a key that is already one of the model's own
names as it is: they exist for old checkpoints of other models, not for models whose
parameters really carry those names."""

import warnings

import torch
from safetensors.torch import load_file, save_file

import weightplan

from tests.conftest import module_with


def _numbered(model):
    return {k: torch.full_like(v, i + 1.0) for i, (k, v) in enumerate(model.state_dict().items())}


def _loads_as_is(model, path):
    state = _numbered(model)
    save_file(state, str(path))
    plan = weightplan.explain(model, str(path))
    assert not plan.problems and not plan.missing and not plan.unexpected, str(plan)
    plan.execute(strict=True, progress=False)
    got = model.state_dict()
    for key, value in state.items():
        assert torch.equal(got[key], value), key
    return state


def test_torch_old_weight_norm_plain_weight_g_and_weight_v_load_and_save_as_is(tmp_path):
    """torch's old ``weight_norm`` keeps ``weight_g`` / ``weight_v`` as plain parameters:
    a model built with it loads its own checkpoint under those names and saves them back."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the old weight_norm is deprecated)
        model = torch.nn.Sequential(torch.nn.utils.weight_norm(torch.nn.Linear(2, 3)))
    state = _loads_as_is(model, tmp_path / "m.safetensors")
    assert {"0.weight_g", "0.weight_v"} <= set(state)
    weightplan.save(model, tmp_path / "again", progress=False)
    assert set(load_file(str(tmp_path / "again" / "model.safetensors"))) == set(state)


class _GainedLinear(torch.nn.Module):
    """A parametrized weight beside a gain of its own that is really named ``weight_g``."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(2, 3))
        self.lin.weight_g = torch.nn.Parameter(torch.zeros(3, 1))


def test_a_parameter_really_named_weight_g_is_not_renamed_onto_the_parametrization(tmp_path):
    """Was: ``lin.weight_g`` renamed to ``lin.parametrizations.weight.original0``, a
    ConflictingTransformError (two sources for one tensor) though every key was the model's."""
    _loads_as_is(_GainedLinear(), tmp_path / "m.safetensors")
    plan = weightplan.explain(_GainedLinear(), str(tmp_path / "m.safetensors"))
    assert [n.key for n in plan.notes if "legacy renames left it" in n.message] == [
        "lin.weight_g"], str(plan)


def test_a_model_whose_own_names_hold_the_doubled_model_level_loads_them_as_is(tmp_path):
    """Was: ``model.language_model.model.w`` renamed onto ``model.language_model.w``,
    another of the model's tensors."""
    model = module_with({"model.language_model.model.w": ((2,), torch.float32),
                         "model.language_model.w": ((2,), torch.float32),
                         "language_model.model.model.v": ((2,), torch.float32)}, device="cpu")
    _loads_as_is(model, tmp_path / "m.safetensors")


def test_a_legacy_key_the_model_lacks_is_still_renamed(tmp_path):
    """The other side: an old checkpoint's ``weight_g`` still loads into the parametrization."""
    model = torch.nn.Sequential(torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(2, 3)))
    state = {"0.bias": torch.ones(3), "0.weight_g": torch.full((3, 1), 2.0),
             "0.weight_v": torch.full((3, 2), 3.0)}
    save_file(state, str(tmp_path / "old.safetensors"))
    weightplan.load(model, str(tmp_path / "old.safetensors"), strict=True, progress=False)
    assert torch.equal(model[0].parametrizations.weight.original0, state["0.weight_g"])
    assert torch.equal(model[0].parametrizations.weight.original1, state["0.weight_v"])
