"""Checkpoint headers: every source form, and every kind of bad input gets a typed error."""

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from weightplan.errors import (
    CheckpointError, HeaderError, MissingShardError, NotSafetensorsError,
    TruncatedCheckpointError, UnsafeFormatError,
)
from weightplan.planner.inputs.checkpoint import open_checkpoint

from tests.conftest import write_checkpoint


def tensors():
    return {"a.weight": torch.ones(2, 3), "b.bias": torch.zeros(4, dtype=torch.bfloat16)}


def raw_file(path, header: dict, data: bytes = b"") -> None:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def test_single_file_directory_list_and_dict(tmp_path):
    d = write_checkpoint(tmp_path / "one", tensors())
    for source in (d, d / "model.safetensors", [d / "model.safetensors"], tensors()):
        ckpt = open_checkpoint(source)
        assert set(ckpt.entries) == {"a.weight", "b.bias"}
        assert ckpt.entries["b.bias"].spec.dtype == torch.bfloat16
        assert ckpt.entries["a.weight"].spec.shape == (2, 3)


def test_sharded_directory_with_index(tmp_path):
    d = write_checkpoint(tmp_path / "sh", {f"k{i}": torch.ones(i + 1) for i in range(5)}, shards=2)
    ckpt = open_checkpoint(d)
    assert len(ckpt) == 5 and len(ckpt.files) == 2
    files = {e.file for e in ckpt.entries.values()}
    assert len(files) == 2


def test_model_safetensors_beside_an_index_is_the_checkpoint_as_for_transformers(tmp_path):
    """transformers' from_pretrained loads ``model.safetensors`` when a directory also holds
    an index (a single-file save left over, or the other way round); weightplan read the
    index's shards: another checkpoint than transformers' (repro: a directory with both,
    different values in each, loaded the shards' values)."""
    d = write_checkpoint(tmp_path / "both", {f"k{i}": torch.ones(i + 1) for i in range(3)},
                         shards=2)
    save_file({f"k{i}": torch.zeros(i + 1) for i in range(3)}, str(d / "model.safetensors"))
    ckpt = open_checkpoint(d)
    assert [f.path for f in ckpt.files] == [str(d / "model.safetensors")]
    assert {e.file for e in ckpt.entries.values()} == {str(d / "model.safetensors")}


def test_safetensors_files_the_checkpoint_leaves_out_are_noted(tmp_path):
    """A shard the index doesn't name (a download's leftover, a shard added by hand) is not
    read, as by transformers, and the plan and a conversion's plan say so (was: not a word,
    while a user converting the directory lost its tensors); so are shards beside a
    ``model.safetensors``."""
    import weightplan

    d = write_checkpoint(tmp_path / "sh", {f"k{i}": torch.ones(i + 1) for i in range(4)},
                         shards=2)
    save_file({"extra": torch.ones(2)}, str(d / "model-00003-of-00003.safetensors"))
    ckpt = open_checkpoint(d)
    assert "extra" not in ckpt.entries
    assert [name for name, _ in ckpt.left_out] == ["model-00003-of-00003.safetensors"]
    for plan in (weightplan.explain(None, d), weightplan.explain_convert(d, tmp_path / "out",
                                                                         mapping=[])):
        note = next(n for n in plan.notes if n.key == "model-00003-of-00003.safetensors")
        assert "not read: the index doesn't name it" in note.message
        assert "model-00003-of-00003.safetensors" in str(plan)
    save_file({"k0": torch.ones(1)}, str(d / "model.safetensors"))
    assert [name for name, _ in open_checkpoint(d).left_out] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model-00003-of-00003.safetensors"]
    assert "model.safetensors is read alone" in open_checkpoint(d).left_out[0][1]
    assert open_checkpoint(write_checkpoint(tmp_path / "one", tensors())).left_out == ()


def test_offsets_point_at_the_data(tmp_path):
    d = write_checkpoint(tmp_path / "x", {"t": torch.arange(6, dtype=torch.int32)})
    entry = open_checkpoint(d).entries["t"]
    with open(entry.file, "rb") as f:
        f.seek(entry.offset)
        data = f.read(entry.nbytes)
    assert torch.equal(torch.frombuffer(bytearray(data), dtype=torch.int32), torch.arange(6, dtype=torch.int32))


def test_pickle_files_are_refused_without_being_opened(tmp_path):
    p = tmp_path / "pytorch_model.bin"
    torch.save({"a": torch.ones(1)}, p)
    with pytest.raises(UnsafeFormatError, match="pytorch_model.bin"):
        open_checkpoint(p)
    with pytest.raises(UnsafeFormatError, match="never unpickles"):
        open_checkpoint(tmp_path)


def test_pickle_content_under_a_safetensors_name_is_refused(tmp_path):
    p = tmp_path / "model.safetensors"
    torch.save({"a": torch.ones(1)}, p)
    with pytest.raises(UnsafeFormatError):
        open_checkpoint(p)


def test_not_safetensors(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"hello")
    with pytest.raises(NotSafetensorsError, match="x.safetensors"):
        open_checkpoint(p)
    p.write_bytes(struct.pack("<Q", 4) + b"[1,2]")
    with pytest.raises(NotSafetensorsError, match="JSON object"):
        open_checkpoint(p)


def test_truncated_file_names_file_and_key(tmp_path):
    d = write_checkpoint(tmp_path / "t", {"big": torch.ones(100)})
    path = d / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(TruncatedCheckpointError, match=r"model.safetensors \[big\]"):
        open_checkpoint(path)


def test_header_size_disagreement(tmp_path):
    p = tmp_path / "bad.safetensors"
    raw_file(p, {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}, b"\0" * 16)
    with pytest.raises(HeaderError, match=r"\[w\].*12 bytes.*needs 16"):
        open_checkpoint(p)


@pytest.mark.parametrize("entry, message", [
    ({"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}, "unknown dtype"),
    ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "invalid shape"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}, "invalid data_offsets"),
    ("nope", "not an object"),
])
def test_malformed_entries(tmp_path, entry, message):
    p = tmp_path / "bad.safetensors"
    raw_file(p, {"w": entry}, b"\0" * 8)
    with pytest.raises(HeaderError, match=message):
        open_checkpoint(p)


def test_missing_shard_named_in_index(tmp_path):
    d = write_checkpoint(tmp_path / "sh", {"a": torch.ones(1), "b": torch.ones(1)}, shards=2)
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(MissingShardError, match="model-00002-of-00002.safetensors"):
        open_checkpoint(d)


def test_index_key_absent_from_its_shard(tmp_path):
    d = write_checkpoint(tmp_path / "sh", {"a": torch.ones(1), "b": torch.ones(1)}, shards=2)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["ghost"] = "model-00001-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(HeaderError, match=r"\[ghost\]"):
        open_checkpoint(d)


def test_duplicate_key_across_files(tmp_path):
    save_file({"a": torch.ones(1)}, str(tmp_path / "1.safetensors"))
    save_file({"a": torch.ones(1)}, str(tmp_path / "2.safetensors"))
    with pytest.raises(HeaderError, match="also present"):
        open_checkpoint(tmp_path)


def test_missing_file_and_empty_directory(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        open_checkpoint(tmp_path / "nope.safetensors")
    with pytest.raises(CheckpointError, match="no .safetensors"):
        open_checkpoint(tmp_path)


def test_dict_values_must_be_tensors():
    with pytest.raises(HeaderError, match=r"\[x\]"):
        open_checkpoint({"x": [1, 2]})
