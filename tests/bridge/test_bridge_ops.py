"""TransposeToFit (transformers' Transpose(check_dims=True)): both layouts load."""

import pytest
import torch

import weightplan
from weightplan import WeightConverter
from weightplan.bridge.ops import TransposeToFit
from weightplan.errors import NotInvertibleError

from tests.conftest import module_with


def converter():
    return WeightConverter("experts.gate_up_proj", "experts.gate_up_proj", [TransposeToFit(1, 2)])


@pytest.mark.parametrize("stored", ["transposed", "as_model"])
def test_either_layout_loads(stored):
    value = torch.arange(24.0).reshape(2, 4, 3)  # (experts, 2·inter, hidden) in the model
    ckpt = value.transpose(1, 2).contiguous() if stored == "transposed" else value
    model = module_with({"experts.gate_up_proj": ((2, 4, 3), torch.float32)})
    plan = weightplan.explain(model, {"experts.gate_up_proj": ckpt}, mapping=[converter()])
    assert not plan.mismatched and not plan.missing, str(plan)
    (op,) = plan.conversions[0].ops
    assert op.swap is (stored == "transposed")
    plan.execute()
    assert torch.equal(model.experts.gate_up_proj, value)


def test_only_a_planned_op_has_an_inverse():
    with pytest.raises(NotInvertibleError, match="decided against the model"):
        TransposeToFit(1, 2).inverse()
    assert TransposeToFit(1, 2, swap=True).inverse() == TransposeToFit(2, 1, swap=True)
