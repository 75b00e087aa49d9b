"""The header-only gpt-oss-120b (MXFP4) and Kimi-K2 (INT4 experts) fixtures of
``benchmarks/quant.py``, cut to a few layers: real key names, shapes and shard layout,
explained with no problem, every stored weight paired and named once in the notes."""

import pytest
import torch

import weightplan

pytest.importorskip("transformers")


@pytest.mark.parametrize("name,phrase,count", [
    ("gpt-oss-120b", "MXFP4 (E2M1, 32 per E8M0 scale): 4 tensors", 4),
    ("kimi-k2", "INT4 pack-quantized (group 32, symmetric): 1152 tensors", 1152)])
def test_frontier_fixture_explains_without_problems(tmp_path, name, phrase, count):
    from benchmarks.plan import meta_model
    from benchmarks.quant import fixture

    directory = fixture(tmp_path, name, layers=2)
    plan = weightplan.explain(meta_model(directory), directory, dtype=torch.bfloat16)
    text = str(plan)
    assert not plan.problems and not plan.missing and not plan.unexpected, text
    assert text.count(phrase) == 1, text
    kinds = [n for c in plan.conversions for n in c.nodes if n.kind.value == "dequantize"]
    assert len(kinds) == count
