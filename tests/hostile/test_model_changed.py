"""Issue 21 item 8: a model changed between explain() and execute() is refused.

The pre-load check compared allocation and shape only: a model cast after explain()
(``m.double()``, ``.half()``, ``.bfloat16()``), a parameter replaced by a same-shape tensor
with other strides, a tie undone, or two parameters made to share memory loaded garbage
(or lost one side) silently. Each is refused now, naming the key and what changed, with
the model untouched.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import weightplan
from weightplan.errors import PlanError


def _checkpoint(tmp_path):
    torch.manual_seed(0)
    tensors = {"a.weight": torch.randn(8, 4), "b.weight": torch.randn(8, 4)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path / "model.safetensors", tensors


def _model(meta: bool = False) -> nn.Module:
    model = nn.Module()
    for name in ("a", "b"):
        model.add_module(name, nn.Linear(4, 8, bias=False, device="meta" if meta else None))
    return model


@pytest.mark.parametrize("cast", ["double", "half", "bfloat16"])
@pytest.mark.parametrize("meta", [False, True])
def test_a_model_cast_after_explain_is_refused(tmp_path, cast, meta):
    path, _ = _checkpoint(tmp_path)
    model = _model(meta)
    plan = weightplan.explain(model, path)
    getattr(model, cast)()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(PlanError, match=r"a\.weight is now (float64|float16|bfloat16), the "
                                        r"plan was made for float32"):
        plan.execute()
    after = model.state_dict()
    assert all(after[k].is_meta or torch.equal(after[k], v) for k, v in before.items())


def test_a_parameter_replaced_by_other_strides_is_refused(tmp_path):
    path, _ = _checkpoint(tmp_path)
    model = _model()
    plan = weightplan.explain(model, path)
    model.b.weight = nn.Parameter(torch.zeros(4, 8).t())  # same shape, column-major
    with pytest.raises(PlanError, match=r"b\.weight now has strides \(1, 8\), the plan was "
                                        r"made for \(4, 1\)"):
        plan.execute()
    assert not model.b.weight.any()


def test_a_tie_undone_after_explain_is_refused(tmp_path):
    path, tensors = _checkpoint(tmp_path)
    save_file({"a.weight": tensors["a.weight"]}, str(path))
    model = _model()
    model.b.weight = model.a.weight  # tied: one destination, two names
    plan = weightplan.explain(model, path)
    model.b.weight = nn.Parameter(torch.zeros(8, 4))
    with pytest.raises(PlanError, match="no longer one tensor with b.weight"):
        plan.execute()


def test_parameters_made_to_share_memory_are_refused(tmp_path):
    path, _ = _checkpoint(tmp_path)
    model = _model()
    plan = weightplan.explain(model, path)
    model.b.weight.data = model.a.weight.data  # one storage, two destinations
    with pytest.raises(PlanError, match="a.weight and b.weight now share memory"):
        plan.execute()


def test_an_unchanged_model_still_loads(tmp_path):
    path, tensors = _checkpoint(tmp_path)
    model = _model()
    weightplan.explain(model, path).execute()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in tensors.items())
