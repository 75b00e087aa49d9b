"""The dequantize nodes of a stream of packed weights are made in columns when every
source is packed with as many parts (a stack's experts), else entry by entry: both ways
give the same nodes, for every format and any run of experts."""

import dataclasses

import pytest

from tests.quant.checkpoints import quantized_checkpoint
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.tensors.ir.packed_build import each_packed, packed_stream, stacked_packed
from weightplan.planner.tensors.ir.quant_build import quant_context

pytest.importorskip("compressed_tensors")


def pairing_of(tmp_path_factory, kind):
    qdir, _ = quantized_checkpoint(tmp_path_factory.getbasetemp(), kind)
    ckpt = open_checkpoint(qdir)
    quant = quant_context(qdir, ckpt, None)
    assert quant is not None and quant.packed is not None
    return ckpt, quant.packed


@pytest.mark.parametrize("kind", ["int", "int-asym", "nvfp4", "modelopt", "fp8-block"])
@pytest.mark.parametrize("start, stop", [(0, 1), (1, 4), (0, 12)])
def test_columns_and_entry_by_entry_make_the_same_nodes(tmp_path_factory, kind, start, stop):
    import torch

    _, pairing = pairing_of(tmp_path_factory, kind)
    keys = sorted(k for k in pairing.weights if ".experts." in k)[start:stop]
    entries = [pairing.entry(k) for k in keys]
    packed = [pairing.weights[k] for k in keys]
    sources = [(2, i) for i in range(len(keys))]
    stacked = stacked_packed(packed, sources, torch.bfloat16)
    each = each_packed(entries, packed, sources, torch.bfloat16)
    assert stacked[0] == each[0] and stacked[1] == each[1]
    assert sorted(map(hash, stacked[2])) == sorted(map(hash, each[2]))
    assert set(stacked[2]) == set(each[2])
    assert packed_stream(entries, sources, torch.bfloat16) == stacked


def test_a_stream_mixing_plain_sources_goes_entry_by_entry(tmp_path_factory):
    import torch

    ckpt, pairing = pairing_of(tmp_path_factory, "int")
    key = sorted(k for k in pairing.weights if ".experts." in k)[0]
    plain = ckpt.entries["model.norm.weight"]
    entries = [pairing.entry(key), plain]
    values, reads, added = packed_stream(entries, [(0, 0), (0, 1)], torch.bfloat16)
    assert values[0].kind.name == "DEQUANTIZE" and values[1].kind.name == "READ"
    assert values[1] in reads and values[0] in added


@pytest.mark.parametrize("kind", ["int", "nvfp4", "modelopt"])
def test_a_merged_stack_of_packed_experts_is_cut_straight_from_its_nodes(tmp_path_factory,
                                                                         kind):
    """A conversion merging packed experts lies as built (each part's reads, then the
    dequantizes): its stage 0 is cut straight from the nodes, and is what the definition
    (the dequantize of each source, looked up read by read) says."""
    import torch

    from tests.planner.test_stages import _definition
    from weightplan import WeightConverter
    from weightplan.ops import MergeModulelist
    from weightplan.planner.inputs.fp8_pairs import Fp8Pairing
    from weightplan.planner.keys.routing import Group, Route
    from weightplan.planner.tensors.ir import stages as ir_stages
    from weightplan.planner.tensors.ir.build import SinkKind, build_conversion, stages
    from weightplan.planner.tensors.ir.nodes import NodeKind
    from weightplan.planner.tensors.ir.quant_build import QuantContext

    _, pairing = pairing_of(tmp_path_factory, kind)
    keys = sorted(k for k in pairing.weights
                  if ".layers.0.mlp.experts." in k and k.endswith("gate_proj.weight"))
    assert len(keys) > 1
    entries = tuple(pairing.entry(k) for k in keys)
    quant = QuantContext(Fp8Pairing({}, (), frozenset()), None, None, packed=pairing)
    converter = WeightConverter(["experts.*.gate"], ["w"], [MergeModulelist(0)])
    group = Group(converter, (entries,), (tuple(Route(e.key, e.key, ()) for e in entries),),
                  ("w",))
    conv = build_conversion(group, None, torch.bfloat16, SinkKind.MEMORY, quant)
    cut = ir_stages._as_built(conv.nodes, (len(entries),), [n.kind for n in conv.nodes])
    assert cut is not None and all(n.kind is NodeKind.DEQUANTIZE for n in cut[0])
    assert cut == stages(conv)[0] == _definition(conv)[0]
    assert stages(conv) == _definition(conv)
    reversed_reads = (*conv.nodes[:len(entries)][::-1], *conv.nodes[len(entries):])
    moved = dataclasses.replace(conv, nodes=reversed_reads)
    assert ir_stages._as_built(moved.nodes, (len(entries),), [n.kind for n in moved.nodes]) \
        is None and stages(moved) == _definition(moved)


@pytest.mark.parametrize("kind", ["int", "int-asym", "nvfp4", "modelopt"])
def test_weights_of_one_shape_share_one_spec_across_key_templates(tmp_path_factory, kind):
    """The weights of one logical shape span several key templates (``gate_proj`` and
    ``up_proj``; a layer's ``experts.1`` and ``experts.11``: paired a template at a time),
    and hold one spec object: the passes that tell specs apart by identity first (a
    merge's stacked specs, the lowering's stack geometry) see one spec, not one per
    template."""
    _, pairing = pairing_of(tmp_path_factory, kind)
    specs: dict[tuple[int, ...], set[int]] = {}
    templates: dict[tuple[int, ...], set[str]] = {}
    for w in pairing.stored:
        specs.setdefault(tuple(w.spec.shape), set()).add(id(w.spec))
        templates.setdefault(tuple(w.spec.shape), set()).add(
            "".join("1" if c.isdigit() else c for c in w.key))
    assert any(len(t) > 1 for t in templates.values())
    assert all(len(ids) == 1 for ids in specs.values())
