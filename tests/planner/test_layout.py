"""Shard layouts are decided from specs: valid safetensors headers, packed offsets."""

import json
import struct

import torch
from safetensors.torch import load_file

from weightplan.planner.write.shards import encode_header, plan_layout
from weightplan.planner.core.spec import TensorSpec


def spec(*shape, dtype=torch.float32):
    return TensorSpec(shape, dtype)


def test_header_is_padded_json_with_packed_offsets(tmp_path):
    tensors = [("b", spec(3)), ("a", spec(2, 2, dtype=torch.bfloat16))]
    header, offsets = encode_header(tensors, {"format": "pt"})
    (n,) = struct.unpack("<Q", header[:8])
    assert n % 8 == 0 and len(header) == 8 + n
    body = json.loads(header[8:])
    assert body["b"]["data_offsets"] == [0, 12] and body["a"]["data_offsets"] == [12, 20]
    assert offsets == {"b": 8 + n, "a": 8 + n + 12}
    path = tmp_path / "x.safetensors"
    data = torch.arange(3, dtype=torch.float32).view(torch.uint8).tolist() + [0] * 8
    path.write_bytes(header + bytes(data))
    loaded = load_file(str(path))
    assert torch.equal(loaded["b"], torch.arange(3, dtype=torch.float32))


def test_sharding_is_greedy_and_big_tensors_get_their_own_shard():
    tensors = [(f"t{i}", spec(25)) for i in range(4)] + [("huge", spec(1000))]
    layout = plan_layout(tensors, max_shard_size=200)
    assert [f.keys for f in layout.files] == [("t0", "t1"), ("t2", "t3"), ("huge",)]
    assert [f.name for f in layout.files][0] == "model-00001-of-00003.safetensors"
    index = json.loads(layout.index)
    assert index["weight_map"]["huge"] == "model-00003-of-00003.safetensors"
    assert index["metadata"]["total_size"] == 4 * 100 + 4000


def test_one_shard_is_model_safetensors_without_index():
    layout = plan_layout([("a", spec(2))], max_shard_size=10**9)
    assert layout.names == ("model.safetensors",) and layout.index is None
