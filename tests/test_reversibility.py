"""Property tests: every transform has an exact inverse.

Random mappings (fused and stacked experts, their ``()`` per-tensor scales, uneven-free chunks, transposes, RoPE
permutations, conv reshapes, splits, op chains, renames with groups, prefix changes,
scopes, legacy names) over random dtypes (bf16, fp16, fp8 e4m3, ints, f32) and shapes:
``revert(convert(x)) == x`` bit for bit, and on disk ``save(load(ckpt)) == ckpt``.
"""

import itertools

import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.torch import load_file

import weightplan
from weightplan import PrefixChange, WeightConverter, WeightRenaming
from weightplan.ops import (
    Chunk, Concatenate, Conv3dToLinear, MergeModulelist, PermuteForRope, SplitModulelist,
    Transpose,
)

from tests.conftest import module_with, write_checkpoint

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int32,
          torch.int8, torch.uint8]
_counter = itertools.count()


def random_bits(shape, dtype, seed):
    """Any bit pattern (NaNs included): round trips must preserve bytes, not values."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.tensor(shape).prod()) if shape else 1
    raw = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def block_tensors(name, layers, experts, dims, dtype, seed):
    """Checkpoint tensors of one building block (its converter is in ``CONVERTERS``)."""
    a, b, hd = dims
    out = {}
    for layer in range(layers):
        p = f"layers.{layer}"
        if name == "fused":
            for e in range(experts):
                out[f"{p}.moe.experts.{e}.w1.weight"] = (a, b)
                out[f"{p}.moe.experts.{e}.w3.weight"] = (a, b)
        elif name == "stacked":
            for e in range(experts):
                out[f"{p}.moe.experts.{e}.w2.weight"] = (b, a)
        elif name == "qkv":
            out[f"{p}.attn.qkv.weight"] = (3 * a, b)
        elif name == "transpose":
            out[f"{p}.fc.kernel"] = (a, b)
        elif name == "rope":
            out[f"{p}.rot.weight"] = (2 * hd, b)
        elif name == "split":
            out[f"{p}.packed.weight"] = (experts, a)
        elif name == "chain":
            for e in range(experts):
                out[f"{p}.chain.{e}.p"] = (a, b)
        elif name == "scales":  # ModelOpt's per-tensor () global scales, per expert
            for e in range(experts):
                out[f"{p}.moe.experts.{e}.g.weight_scale_2"] = ()
                out[f"{p}.moe.experts.{e}.u.weight_scale_2"] = ()
        elif name == "plain":
            out[f"{p}.norm.weight"] = (b,)
        elif name == "legacy":
            out[f"{p}.LayerNorm.gamma"] = (b,)
    if name == "conv":
        out["patch.conv.weight"] = (a, 2, 2, 1, 2)
    return {k: random_bits(s, dtype, seed + i) for i, (k, s) in enumerate(sorted(out.items()))}


CONVERTERS = {
    "fused": lambda hd: WeightConverter([".experts.*.w1.weight", ".experts.*.w3.weight"],
                                        ".experts.gate_up", [MergeModulelist(0), Concatenate(1)]),
    "stacked": lambda hd: WeightConverter(".experts.*.w2.weight", ".experts.down",
                                          [MergeModulelist(0)]),
    "qkv": lambda hd: WeightConverter("qkv.weight", ["q.weight", "k.weight", "v.weight"],
                                      [Chunk(0)]),
    "transpose": lambda hd: WeightConverter(r"fc\.kernel", "fc.weight", [Transpose(0, 1)]),
    "rope": lambda hd: WeightConverter(r"rot\.weight", "rot_half.weight",
                                       [PermuteForRope(head_dim=hd)]),
    "split": lambda hd: WeightConverter(r"packed\.weight", "packed.*.item", [SplitModulelist(0)]),
    "chain": lambda hd: WeightConverter(r"chain\.*\.p", "chain.stacked",
                                        [MergeModulelist(0), Transpose(1, 2)]),
    "scales": lambda hd: WeightConverter([".experts.*.g.weight", ".experts.*.u.weight"],
                                         ".experts.gu", [MergeModulelist(0), Concatenate(1)]),
    "conv": lambda hd: WeightConverter(r"patch\.conv\.weight", "patch.proj.weight",
                                       [Conv3dToLinear(2, (2, 1, 2))]),
}


@st.composite
def families(draw):
    layers, experts = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    dims = (draw(st.integers(1, 4)), draw(st.integers(1, 4)), 2 * draw(st.integers(1, 3)))
    dtype = draw(st.sampled_from(DTYPES))
    names = draw(st.sets(st.sampled_from(sorted([*CONVERTERS, "plain", "legacy"])), min_size=1))
    seed = draw(st.integers(0, 2**16))
    tensors, mapping = {}, []
    for name in sorted(names):
        tensors.update(block_tensors(name, layers, experts, dims, dtype, seed + 100 * len(tensors)))
        if name in CONVERTERS:
            mapping.append(CONVERTERS[name](dims[2]))
    if draw(st.booleans()) and names & {"fused", "stacked"}:
        mapping.insert(0, WeightRenaming(r"\.moe\.", ".mlp."))
    if draw(st.booleans()):
        mapping.insert(0, WeightRenaming(r"^layers\.(\d+)\.", r"blocks.\1."))
    if draw(st.booleans()):  # a scope: everything moves under vision., one transform scoped
        tensors = {f"vision.{k}": v for k, v in tensors.items()}
        mapping = [t.with_scope("vision") for t in mapping]
    prefix = draw(st.booleans())
    if prefix:
        mapping.append(PrefixChange(prefix_to_add="model"))
    return tensors, mapping, prefix


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(families())
def test_revert_of_convert_is_the_identity(family):
    tensors, mapping, prefix = family
    converted = weightplan.convert(tensors, mapping)
    back = weightplan.revert(converted, mapping)
    assert set(back) == set(tensors)
    assert all(same_bits(back[k], tensors[k]) for k in tensors)
    legacy = any("LayerNorm.gamma" in k for k in tensors)
    if not prefix and not legacy:  # without a record, the mapping's inverse alone suffices
        derived = weightplan.revert(dict(converted), mapping)
        assert set(derived) == set(tensors)
        assert all(same_bits(derived[k], tensors[k]) for k in tensors)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(families(), st.sampled_from([1, 2]))
def test_save_of_load_is_the_checkpoint_on_disk(tmp_path, family, shards):
    tensors, mapping, _ = family
    run = tmp_path / f"run{next(_counter)}"
    src = write_checkpoint(run / "src", tensors, shards=min(shards, len(tensors)))
    converted = weightplan.convert(tensors, mapping)
    model = module_with({k: (tuple(v.shape), v.dtype) for k, v in converted.items()})
    weightplan.load(model, src, mapping=mapping, strict=True)
    weightplan.save(model, run / "out", max_shard_size=64)
    back = {}
    for f in sorted((run / "out").glob("*.safetensors")):
        back.update(load_file(str(f)))
    assert set(back) == set(tensors)
    assert all(same_bits(back[k], tensors[k]) for k in tensors)
