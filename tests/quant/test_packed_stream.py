"""The dequantize nodes of a stream of packed weights are made in columns when every
source is packed with as many parts (a stack's experts), else entry by entry: both ways
give the same nodes, for every format and any run of experts."""

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
    assert packed_stream(entries, sources, pairing, torch.bfloat16) == stacked


def test_a_stream_mixing_plain_sources_goes_entry_by_entry(tmp_path_factory):
    import torch

    ckpt, pairing = pairing_of(tmp_path_factory, "int")
    key = sorted(k for k in pairing.weights if ".experts." in k)[0]
    plain = ckpt.entries["model.norm.weight"]
    entries = [pairing.entry(key), plain]
    values, reads, added = packed_stream(entries, [(0, 0), (0, 1)], pairing, torch.bfloat16)
    assert values[0].kind.name == "DEQUANTIZE" and values[1].kind.name == "READ"
    assert values[1] in reads and values[0] in added
