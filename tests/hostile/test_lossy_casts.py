"""Casts that lose values by kind (complex → real, float → integer, integer → bool) are a plan
problem naming the file and key, and ``execute`` refuses them before anything is written;
the same cast done by an op of the mapping (the mapping asks for it) loads."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

import weightplan
from weightplan import WeightConverter
from weightplan.errors import LossyCastError
from weightplan.ops import TensorwiseOp
from weightplan.planner.pipelines.findings import lossy_cast

from tests.conftest import module_with, write_checkpoint

DTYPES = [torch.complex64, torch.complex128, torch.float64, torch.float32, torch.bfloat16,
          torch.float16, torch.float8_e4m3fn, torch.int64, torch.int32, torch.int16, torch.int8,
          torch.uint8, torch.bool]


def kind(dtype):
    return ("complex" if dtype.is_complex else "float" if dtype.is_floating_point else
            "bool" if dtype is torch.bool else "int")


LOSSY = {("complex", "float"), ("complex", "int"), ("complex", "bool"), ("float", "int"),
         ("float", "bool"), ("int", "bool")}


@pytest.mark.parametrize("have", DTYPES)
@pytest.mark.parametrize("want", DTYPES)
def test_every_pair_the_planner_casts_is_judged_by_kind(have, want):
    assert (lossy_cast(have, want) is not None) == ((kind(have), kind(want)) in LOSSY)


@pytest.mark.parametrize("have, want", [(torch.complex64, torch.float32),
                                        (torch.float32, torch.int64),
                                        (torch.int32, torch.bool)])
def test_a_lossy_cast_is_a_problem_and_execute_refuses_it(tmp_path, have, want):
    values = torch.tensor([1.5, -2.0, 3.0])
    stored = torch.complex(values, values) if have.is_complex else values.to(have)
    ckpt = write_checkpoint(tmp_path / "c", {"w": stored, "ok": torch.ones(2)})
    model = module_with({"w": ((3,), want), "ok": ((2,), torch.float32)})
    plan = weightplan.explain(model, ckpt)
    (problem,) = [p for p in plan.problems if p.kind.value == "lossy cast"]
    assert problem.key == "w" and str(ckpt / "model.safetensors") in problem.message
    assert "lossy cast: w: the checkpoint gives" in str(plan)
    with pytest.raises(LossyCastError, match="nothing was loaded") as caught:
        plan.execute()
    assert "w in " in str(caught.value)
    assert all(p.is_meta for p in model.parameters())  # refused before a byte was written


def test_allowed_casts_still_load(tmp_path):
    tensors = {"a": torch.tensor([1.0, 2.0], dtype=torch.bfloat16), "b": torch.tensor([1, 2]),
               "c": torch.tensor([True, False])}
    ckpt = write_checkpoint(tmp_path / "c", tensors)
    model = module_with({"a": ((2,), torch.float32), "b": ((2,), torch.float32),
                         "c": ((2,), torch.int64)})
    plan = weightplan.explain(model, ckpt)
    assert not plan.problems
    plan.execute()
    assert torch.equal(model.b, torch.tensor([1.0, 2.0])) and model.c.tolist() == [1, 0]


class RealPart(TensorwiseOp):
    """The mapping asks for the cast: the real part, taken explicitly."""

    def forward_one(self, tensor, stream):
        return tensor.real.contiguous()


def test_the_mapping_may_ask_for_the_cast(tmp_path):
    stored = torch.complex(torch.tensor([1.0, 2.0]), torch.tensor([5.0, 6.0]))
    ckpt = write_checkpoint(tmp_path / "c", {"w": stored})
    model = module_with({"w": ((2,), torch.float32)})
    mapping = [WeightConverter("w", "w", operations=[RealPart()])]
    plan = weightplan.explain(model, ckpt, mapping=mapping)
    assert not [p for p in plan.problems if p.kind.value == "lossy cast"]
    plan.execute()
    assert torch.equal(model.w.data, torch.tensor([1.0, 2.0]))


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(DTYPES), st.sampled_from(DTYPES))
def test_the_judgement_is_by_kind_only(have, want):
    same_kinds = [(a, b) for a in DTYPES for b in DTYPES if kind(a) == kind(have)
                  and kind(b) == kind(want)]
    assert {lossy_cast(a, b) is None for a, b in same_kinds} == {lossy_cast(have, want) is None}
