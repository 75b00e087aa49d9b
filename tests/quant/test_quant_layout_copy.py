"""A packed copy in the model's layout (``weightplan convert SRC DST --mapping M`` without
``--dequantize``: ``experts.gate_up_proj_packed``, ``_scale``, …) loaded into a floating
model: a ``QuantizationError`` naming the copy and the way back, before anything is read.
Was: int4's fused experts left to the model's init with only a warning (a silently wrong
model), FP8's refused for a ``_scale_inv`` it doesn't have, ModelOpt's as a shape
mismatch. The way back it names works: the reverse convert loads equal to the original."""

from __future__ import annotations

import pytest
import torch

import weightplan
from tests.quant.checkpoints import quantized_checkpoint
from weightplan.errors import QuantizationError

pytest.importorskip("compressed_tensors")


@pytest.mark.parametrize("kind", ["int", "fp8-block", "modelopt"])
def test_a_model_layout_copy_is_refused_by_name_and_its_way_back_loads(tmp_path, kind):
    qdir, _ = quantized_checkpoint(tmp_path, kind)
    copy, back = tmp_path / "fused", tmp_path / "back"
    weightplan.explain_convert(qdir, copy, mapping="qwen3_moe").execute()
    for options in ({"dtype": torch.bfloat16}, {"dequantize": True}):
        with pytest.raises(QuantizationError, match=r"experts\.(gate_up|down)_proj_\w+ \(and "
                           r"\d+ more\) holds .* in the model's layout.*--reverse"):
            weightplan.from_pretrained(copy, **options)
    weightplan.explain_convert(copy, back, mapping="qwen3_moe", reverse=True).execute()
    want = weightplan.from_pretrained(qdir, dtype=torch.bfloat16).state_dict()
    got = weightplan.from_pretrained(back, dtype=torch.bfloat16).state_dict()
    assert sorted(got) == sorted(want)
    assert [k for k, v in want.items() if not torch.equal(got[k], v)] == []
