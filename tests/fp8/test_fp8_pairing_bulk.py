"""``pair_scales`` (column by column; scales found by position in sorted headers, by key
otherwise) finds exactly what pairing weight by weight finds: the same pairs (weight,
scale, block, activation), problems (in order, same messages) and companions, on
checkpoints with missing, mis-shaped and mistyped scales, activation scales and stray
scales, in sorted order and shuffled."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightplan.planner.inputs import fp8_pairs
from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.inputs.fp8_pairs import (
    Fp8Problem, Fp8ProblemKind, ScaledWeight, ScaledWeights, pair_scales,
)
from weightplan.planner.inputs.quant_config import QuantConfig
from weightplan.planner.core.quant.blocks import FP8_DTYPES, SCALE_DTYPES, grid_fits, scale_grid
from weightplan.planner.core.spec import TensorSpec, short_dtype

F8 = torch.float8_e4m3fn


def _reference(entries, config):
    """Pairing weight by weight, as the module docstring says (pairs, problems, companions)."""
    block = config.block if config is not None else (128, 128)
    pairs, problems = {}, []
    for key, weight in entries.items():
        if weight.spec.dtype not in FP8_DTYPES or fp8_pairs.is_scale_key(key):
            continue
        shape, scale = weight.spec.shape, entries.get(key + "_scale_inv")
        expected = scale_grid(shape, block) if len(shape) >= 2 else None
        if scale is None:
            problems.append(Fp8Problem(
                Fp8ProblemKind.MISSING_SCALE, key,
                f"{fp8_pairs.at(weight)}{key} is {short_dtype(weight.spec.dtype)}{list(shape)} "
                "but the checkpoint "
                f"has no {key}_scale_inv; without it the weight can't be dequantized (a plain "
                "cast would be wrong). Add the scale tensor, or load a checkpoint that has it",
                shape, None, expected))
        elif scale.spec.dtype not in SCALE_DTYPES:
            problems.append(Fp8Problem(
                Fp8ProblemKind.SCALE_DTYPE, scale.key,
                f"{fp8_pairs.at(scale)}{scale.key} is {short_dtype(scale.spec.dtype)}; a scale "
                "is f32, bf16, f16 or "
                "e8m0 (u8 / f8_e8m0)", shape, scale.spec.shape, expected))
        elif not grid_fits(shape, scale.spec.shape, block):
            problems.append(Fp8Problem(Fp8ProblemKind.SCALE_GRID, scale.key,
                                       fp8_pairs.at(weight if len(shape) < 2 else scale)
                                       + fp8_pairs._grid_text(
                                           weight, scale, block), shape,
                                       scale.spec.shape, expected))
        else:
            activation = next((entries[k] for k in fp8_pairs.activation_keys(key)
                               if k in entries), None)
            pairs[key] = ScaledWeight(weight, scale, block, activation)
    companions = frozenset(k for p in pairs.values() for k in p.companions)
    for key, entry in entries.items():
        owner = fp8_pairs.weight_key_of(key)
        if owner is None or key in companions or owner in pairs:
            continue
        weight = entries.get(owner)
        if weight is not None and weight.spec.dtype in FP8_DTYPES:
            continue
        what = ("no such tensor" if weight is None
                else f"it is {short_dtype(weight.spec.dtype)}, not FP8")
        problems.append(Fp8Problem(Fp8ProblemKind.STRAY_SCALE, key,
                                   f"{fp8_pairs.at(entry)}{key} scales {owner}, but {what}: "
                                   "the scale is not applied",
                                   None if weight is None else weight.spec.shape, entry.spec.shape))
    return pairs, tuple(problems), companions


@st.composite
def checkpoints(draw):
    entries: dict[str, TensorEntry] = {}
    block = draw(st.sampled_from([(128, 128), (2, 3), None]))

    specs: dict = {}  # one spec object per (shape, dtype), as a header's entries share them

    def add(key, shape, dtype):
        spec = specs.setdefault((tuple(shape), dtype), TensorSpec(tuple(shape), dtype))
        entries[key] = TensorEntry(key, spec, "f", len(entries))

    for i in range(draw(st.integers(0, 6))):
        key = f"l.{i}." + draw(st.sampled_from(["w.weight", "experts.gate_up_proj", "n.weight"]))
        shape = draw(st.sampled_from([(4, 6), (2, 4, 6), (5,), (256, 300)]))
        add(key, shape, draw(st.sampled_from([F8, F8, F8, torch.bfloat16])))
        scale = draw(st.sampled_from(["grid", "grid", "grid", "missing", "bad grid", "u8",
                                      "i32", "tensor"]))
        grid = scale_grid(shape, block) if len(shape) >= 2 else (1,)
        if scale != "missing":
            add(key + "_scale_inv", {"bad grid": (7,), "tensor": ()}.get(scale, grid),
                {"u8": torch.uint8, "i32": torch.int32}.get(scale, torch.float32))
        for suffix in draw(st.lists(st.sampled_from(fp8_pairs.ACTIVATION_SUFFIXES), unique=True)):
            add(key.removesuffix(".weight") + suffix, (), torch.float32)
    for j in range(draw(st.integers(0, 2))):  # scales of nothing
        add(f"stray.{j}.weight_scale_inv", (1, 1), torch.float32)
    keys = sorted(entries) if draw(st.booleans()) else draw(st.permutations(list(entries)))
    config = None if draw(st.booleans()) else QuantConfig(block=block)
    return {k: entries[k] for k in keys}, config


@settings(max_examples=400, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(checkpoints())
def test_pairing_finds_what_pairing_each_weight_finds(case):
    entries, config = case
    found = pair_scales(entries, config)
    pairs, problems, companions = _reference(entries, config)
    assert dict(found.pairs) == pairs and list(found.pairs) == list(pairs)
    assert found.problems == problems
    assert found.companions == companions
    assert found.activation_count == sum(p.activation is not None for p in pairs.values())


class _NoLookups(dict):
    def get(self, key, default=None):
        raise AssertionError(f"looked {key} up")


def test_scales_in_step_with_their_weights_pair_by_position():
    spec, grid = TensorSpec((256, 300), F8), TensorSpec(scale_grid((256, 300), (128, 128)), torch.float32)
    keys = [k for i in range(4) for k in (f"l.{i}.weight", f"l.{i}.weight_scale_inv")]
    entries = {k: TensorEntry(k, grid if k.endswith("_inv") else spec, "f", n)
               for n, k in enumerate(keys)}
    in_step = pair_scales(_NoLookups(entries))  # sorted headers: no look-up at all
    shuffled = {k: entries[k] for k in keys[1::2][::-1] + keys[::2]}  # scales reversed
    for found in (in_step, pair_scales(shuffled)):
        pairs, problems, companions = _reference(entries, None)
        assert isinstance(found.pairs, ScaledWeights) and dict(found.pairs) == pairs
        assert found.problems == problems == () and found.companions == companions
    assert list(in_step.pairs) == keys[::2]
