"""Deliverable 2: index paths stay inside the checkpoint directory; only regular files open."""

from __future__ import annotations

import json
import os
import threading

import pytest
import torch
from safetensors.torch import load_file, save_file

import weightplan
from weightplan.errors import CheckpointError, MissingShardError, UnsafePathError
from weightplan.planner.inputs.checkpoint import open_checkpoint

from .helpers import load_tensors

INDEX = "model.safetensors.index.json"


def _index(directory, weight_map):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


@pytest.fixture
def outside(tmp_path):
    """A valid shard outside the checkpoint directory."""
    path = tmp_path / "outside" / "x.safetensors"
    path.parent.mkdir()
    save_file({"w": torch.ones(3)}, str(path))
    return path


@pytest.mark.parametrize("name", ["../outside/x.safetensors", "sub/../../outside/x.safetensors",
                                  "./x.safetensors", "..", "", "a//b.safetensors",
                                  "..\\outside\\x.safetensors", "C:\\x.safetensors",
                                  "x\x00.safetensors"])
def test_relative_escapes_are_refused(tmp_path, outside, name):
    ckpt = _index(tmp_path / "ckpt", {"w": name})
    with pytest.raises(UnsafePathError) as info:
        open_checkpoint(ckpt)
    assert INDEX in str(info.value)


def test_absolute_paths_are_refused_even_to_real_files(tmp_path, outside):
    for name in (str(outside), "/etc/passwd"):
        ckpt = _index(tmp_path / "ckpt", {"w": name})
        with pytest.raises(UnsafePathError, match="absolute path"):
            weightplan.explain(None, ckpt)


@pytest.mark.parametrize("name", [1, None, ["x"], {"a": "b"}, True])
def test_non_string_shard_names_are_refused(tmp_path, name):
    ckpt = _index(tmp_path / "ckpt", {"w": name})
    with pytest.raises(UnsafePathError):
        open_checkpoint(ckpt)


def test_symlinked_directory_escape_is_refused(tmp_path, outside):
    ckpt = _index(tmp_path / "ckpt", {"w": "sub/x.safetensors"})
    os.symlink(outside.parent, ckpt / "sub")
    with pytest.raises(UnsafePathError, match="resolves outside"):
        open_checkpoint(ckpt)


def test_symlinked_shards_are_followed_like_the_hf_cache(tmp_path):
    """snapshots/<rev>/model-*.safetensors -> ../../blobs/<hash>: loads, bytes exact."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    tensors = {"a": torch.arange(4.0), "b": torch.arange(6, dtype=torch.int32)}
    save_file({"a": tensors["a"]}, str(blobs / "h1"))
    save_file({"b": tensors["b"]}, str(blobs / "h2"))
    _index(snap, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"})
    os.symlink("../../blobs/h1", snap / "model-00001-of-00002.safetensors")
    os.symlink("../../blobs/h2", snap / "model-00002-of-00002.safetensors")
    out = load_tensors(snap, tensors)
    assert set(out) == {"a", "b"}
    for key, value in tensors.items():
        assert torch.equal(out[key], value)


def test_symlink_to_a_fifo_or_device_is_validated_like_any_file(tmp_path):
    ckpt = tmp_path / "ckpt"
    _index(ckpt, {"w": "model-00001-of-00001.safetensors"})
    os.symlink("/dev/zero", ckpt / "model-00001-of-00001.safetensors")
    with pytest.raises(UnsafePathError, match="character device"):
        open_checkpoint(ckpt)


def test_dangling_symlink_is_a_missing_shard(tmp_path):
    ckpt = _index(tmp_path / "ckpt", {"w": "model-00001-of-00001.safetensors"})
    os.symlink(tmp_path / "nowhere", ckpt / "model-00001-of-00001.safetensors")
    with pytest.raises(MissingShardError):
        open_checkpoint(ckpt)


def _in_thread(fn):
    """Run ``fn`` in a daemon thread; return (finished within the deadline, result)."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(_catch(fn)), daemon=True)
    thread.start()
    thread.join(30)
    return not thread.is_alive(), result


def _catch(fn):
    try:
        return fn()
    except BaseException as e:  # noqa: BLE001 - the test inspects it
        return e


@pytest.mark.parametrize("via", ["file", "directory", "index"])
def test_a_fifo_never_blocks(tmp_path, via):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    fifo = ckpt / "model.safetensors"
    os.mkfifo(fifo)
    if via == "index":
        _index(ckpt, {"w": "model.safetensors"})
    target = fifo if via == "file" else ckpt
    finished, result = _in_thread(lambda: open_checkpoint(target))
    if not finished:  # unblock the reader so the test process can exit
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    assert finished, "explain() blocked on a FIFO"
    assert isinstance(result[0], UnsafePathError) and "FIFO" in str(result[0])


def test_directories_and_devices_named_like_shards(tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "model.safetensors").mkdir(parents=True)
    with pytest.raises(UnsafePathError, match="directory"):
        open_checkpoint(ckpt)
    with pytest.raises(UnsafePathError, match="character device"):
        open_checkpoint("/dev/null")
    with pytest.raises(UnsafePathError, match="directory"):
        open_checkpoint([str(ckpt / "model.safetensors")])


def test_config_json_fifo_does_not_block(tmp_path):
    pytest.importorskip("transformers")
    from weightplan.bridge.config_guard import read_config_json
    from weightplan.errors import ModelBuildError

    os.mkfifo(tmp_path / "config.json")
    finished, result = _in_thread(lambda: read_config_json(tmp_path / "config.json"))
    assert finished and isinstance(result[0], ModelBuildError)


def test_name_too_long_is_typed(tmp_path):
    with pytest.raises(CheckpointError):
        weightplan.explain(None, tmp_path / ("x" * 5000))
    ckpt = _index(tmp_path / "ckpt", {"w": "y" * 5000 + ".safetensors"})
    with pytest.raises(CheckpointError):
        weightplan.explain(None, ckpt)


def test_index_is_bounded_and_strict(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    # (a shard not named model.safetensors: that one is the checkpoint, index or not)
    save_file({"w": torch.ones(1)}, str(ckpt / "shard.safetensors"))
    (ckpt / INDEX).write_text('{"weight_map": {"w": "shard.safetensors", "w": "other"}}')
    with pytest.raises(CheckpointError, match="twice"):
        open_checkpoint(ckpt)
    (ckpt / INDEX).write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(CheckpointError, match="nested"):
        open_checkpoint(ckpt)
    assert load_file(str(ckpt / "shard.safetensors"))["w"].item() == 1.0
