"""``pair_scales``' column-at-a-time path finds exactly what pairing weight by weight finds:
the same pairs (weight, scale, block, activation), problems (in order, same messages) and
companions, on checkpoints with missing, mis-shaped and mistyped scales, activation scales
and stray scales."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightplan.planner.inputs import fp8_pairs
from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.inputs.fp8_pairs import Fp8Problem, Fp8ProblemKind, pair_scales
from weightplan.planner.inputs.quant_config import QuantConfig
from weightplan.planner.core.quant.blocks import FP8_DTYPES, scale_grid
from weightplan.planner.core.spec import TensorSpec, short_dtype

F8 = torch.float8_e4m3fn


def _reference(entries, config):
    """The weight-by-weight pairing the bulk path replaced (pairs, problems, companions)."""
    block = config.block if config is not None else (128, 128)
    pairs, problems = fp8_pairs._pair_each(entries, block)
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
                                   f"{key} scales {owner}, but {what}: the scale is not applied",
                                   None if weight is None else weight.spec.shape, entry.spec.shape))
    return pairs, tuple(problems), companions


@st.composite
def checkpoints(draw):
    entries: dict[str, TensorEntry] = {}
    block = draw(st.sampled_from([(128, 128), (2, 3), None]))

    def add(key, shape, dtype):
        entries[key] = TensorEntry(key, TensorSpec(tuple(shape), dtype), "f", len(entries))

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
    keys = draw(st.permutations(list(entries)))
    config = None if draw(st.booleans()) else QuantConfig(block=block)
    return {k: entries[k] for k in keys}, config


@settings(max_examples=400, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(checkpoints())
def test_bulk_pairing_finds_what_pairing_each_weight_finds(case):
    entries, config = case
    found = pair_scales(entries, config)
    pairs, problems, companions = _reference(entries, config)
    assert dict(found.pairs) == pairs and list(found.pairs) == list(pairs)
    assert found.problems == problems
    assert found.companions == companions


def test_clean_checkpoints_take_the_bulk_path(monkeypatch):
    spec, grid = TensorSpec((256, 300), F8), TensorSpec(scale_grid((256, 300), (128, 128)), torch.float32)
    entries = {}
    for i in range(3):
        for key, s in ((f"l.{i}.weight", spec), (f"l.{i}.weight_scale_inv", grid)):
            entries[key] = TensorEntry(key, s, "f", len(entries))
    monkeypatch.setattr(fp8_pairs, "_pair_each", None)  # would fail if called
    found = pair_scales(entries)
    assert list(found.pairs) == ["l.0.weight", "l.1.weight", "l.2.weight"]
    assert found.companions == {k + "_scale_inv" for k in found.pairs} and not found.problems


class _NoLookups(dict):
    def get(self, key, default=None):
        raise AssertionError(f"looked {key} up")


def test_scales_in_step_with_their_weights_pair_by_position():
    from weightplan.planner.inputs.fp8_pairs import ScaledWeights

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
