"""Deliverable 8: fuzz headers, JSON fields and index files.

Whatever the bytes, weightplan either refuses them with a typed error
(:class:`WeightplanError`) or reads exactly the tensors safetensors' own reader reads
(same keys, dtypes, shapes and bytes) - never another exception, never a file safetensors
refuses. ``WEIGHTPLAN_FUZZ_EXAMPLES=N`` runs N examples per test (default 800, ~3,000 in
all, a few seconds); CI or a long run can raise it.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from weightplan.errors import WeightplanError
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.core.spec import SAFETENSORS_DTYPES

from .helpers import consistent_header, load_tensors

EXAMPLES = int(os.environ.get("WEIGHTPLAN_FUZZ_EXAMPLES", "800"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
DIR = Path(tempfile.mkdtemp(prefix="weightplan-fuzz-"))
INDEX = "model.safetensors.index.json"


def _valid_file() -> bytes:
    header = {"__metadata__": {"format": "pt"},
              "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
              "b": {"dtype": "I8", "shape": [3], "data_offsets": [16, 19]},
              "c": {"dtype": "BF16", "shape": [0], "data_offsets": [19, 19]}}
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + bytes(range(19))


VALID = _valid_file()


def _check(path: Path) -> None:
    """Typed refusal, or exactly what safetensors reads."""
    try:
        ckpt = open_checkpoint(path)
    except WeightplanError:
        return
    raw = path.read_bytes()
    with safe_open(str(path), framework="pt") as f:  # must accept what we accept
        assert set(f.keys()) == set(ckpt.entries)
        for key, e in ckpt.entries.items():
            tensor = f.get_tensor(key)
            assert tensor.dtype == e.spec.dtype and tuple(tensor.shape) == e.spec.shape
            ours = raw[e.offset:e.offset + e.nbytes]
            theirs = _bytes(tensor)
            assert ours == theirs, key


def _bytes(tensor: torch.Tensor) -> bytes:
    if not tensor.numel():
        return b""
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _write(name: str, content: bytes) -> Path:
    path = DIR / name
    path.write_bytes(content)
    return path


mutations = st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete", "truncate"]),
                               st.integers(0, len(VALID)), st.integers(0, 255)),
                     min_size=1, max_size=4)


def _mutate(content: bytes, ops) -> bytes:
    data = bytearray(content)
    for op, at, value in ops:
        at = min(at, len(data))
        if op == "flip" and at < len(data):
            data[at] ^= value or 1
        elif op == "insert":
            data[at:at] = bytes([value])
        elif op == "delete":
            del data[at:at + 1]
        else:
            del data[at:]
    return bytes(data)


@FUZZ
@given(mutations)
def test_fuzz_header_bytes(ops):
    _check(_write("bytes.safetensors", _mutate(VALID, ops)))


json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.floats(),
                        st.text(max_size=4), st.integers(2**62, 2**66))
dims = st.one_of(st.integers(0, 5), st.sampled_from([True, False, -1, 2.0, "2", None, 2**64]))
field = st.one_of(json_scalar, st.lists(json_scalar, max_size=3),
                  st.dictionaries(st.text(max_size=3), json_scalar, max_size=2))
field = st.one_of(field, st.lists(dims, max_size=3),
                  st.sampled_from(sorted(SAFETENSORS_DTYPES) + ["F4", "f32", ""]))


specs = st.lists(st.tuples(st.sampled_from(sorted(SAFETENSORS_DTYPES)),
                          st.lists(st.integers(0, 3), max_size=3)), min_size=1, max_size=4)
edits = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["dtype", "shape", "data_offsets",
                                                               "shift", "drop", "replace"]),
                           field, st.integers(-9, 9)), max_size=2)


def _consistent(spec_list) -> tuple[dict, int]:
    """A valid header for ``spec_list``, and its data length."""
    return consistent_header(spec_list)


def _edit(header: dict, edit_list) -> dict:
    for which, kind, value, delta in edit_list:
        key = f"t{which % len(header)}" if header else "t0"
        entry = header.get(key)
        if not isinstance(entry, dict):
            continue
        if kind in ("dtype", "shape", "data_offsets"):
            entry[kind] = value
        elif kind == "shift" and isinstance(entry.get("data_offsets"), list):
            entry["data_offsets"] = [max(o + delta, 0) if type(o) is int else o
                                     for o in entry["data_offsets"]]
        elif kind == "drop":
            entry.pop(["dtype", "shape", "data_offsets"][abs(delta) % 3], None)
        else:
            header[key] = value
    return header


@FUZZ
@given(specs, edits, st.sampled_from([0, 0, 0, 0, 1, -1, 8]), st.booleans())
def test_fuzz_json_fields(spec_list, edit_list, extra, pad):
    header, data_len = _consistent(spec_list)
    text = json.dumps(_edit(header, edit_list)).encode()
    text += b" " * (-len(text) % 8 if pad else 0)
    data = bytes(i % 251 for i in range(max(data_len + extra, 0)))
    _check(_write("fields.safetensors", struct.pack("<Q", len(text)) + text + data))


shard_names = st.one_of(
    st.sampled_from(["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                     "missing.safetensors", "../model-00001-of-00002.safetensors",
                     "/etc/passwd", "./model-00001-of-00002.safetensors", "", ".", "..",
                     "sub/x.safetensors", "model-00001-of-00002.safetensors\x00"]),
    json_scalar, st.lists(st.text(max_size=2), max_size=2))
index_docs = st.one_of(
    st.fixed_dictionaries({"weight_map": st.dictionaries(st.sampled_from(["a", "b", "c", "z"]),
                                                         shard_names, max_size=4)},
                          optional={"metadata": field}),
    field)


def _index_dir() -> Path:
    directory = DIR / "indexed"
    if not directory.exists():
        directory.mkdir()
        from safetensors.torch import save_file

        save_file({"a": torch.arange(4.0)}, str(directory / "model-00001-of-00002.safetensors"))
        save_file({"b": torch.arange(3, dtype=torch.int16), "c": torch.ones(2, 2)},
                  str(directory / "model-00002-of-00002.safetensors"))
    return directory


@FUZZ
@given(index_docs)
def test_fuzz_index_files(doc):
    directory = _index_dir()
    (directory / INDEX).write_text(json.dumps(doc))
    try:
        ckpt = open_checkpoint(directory)
    except WeightplanError:
        return
    for key, e in ckpt.entries.items():  # only the two real shards, inside the directory
        assert Path(e.file).parent == directory and Path(e.file).name.startswith("model-")
        assert key in ("a", "b", "c")


@settings(max_examples=max(EXAMPLES // 8, 50), deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(mutations)
def test_fuzz_full_loads_are_exact_or_typed(ops):
    """The whole path (explain + execute into a model) on mutated files."""
    path = _write("load.safetensors", _mutate(VALID, ops))
    try:
        ckpt = open_checkpoint(path)
        like = {k: torch.empty(e.spec.shape, dtype=e.spec.dtype)
                for k, e in ckpt.entries.items() if "." not in k and k}
        got = load_tensors(path, like) if like else {}
    except WeightplanError:
        return
    with safe_open(str(path), framework="pt") as f:
        for key, value in got.items():
            theirs = f.get_tensor(key)
            assert value.dtype == theirs.dtype and value.shape == theirs.shape
            assert _bytes(value) == _bytes(theirs), key
