"""Deliverable 3: the safetensors format rules, as safetensors' own reader enforces them."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError
from safetensors.torch import load as st_load

from weightplan.errors import (
    CheckpointError, HeaderError, NotSafetensorsError, TruncatedCheckpointError,
)
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.inputs.safetensors_format import MAX_DEPTH, json_depth_ok, strict_json

from .helpers import entry, good_pair, load_tensors, raw_file, write

A8 = entry("F32", [2], 0, 8)


def _refused(tmp_path, content: bytes, error=HeaderError, match: str | None = None):
    path = write(tmp_path / "model.safetensors", content)
    with pytest.raises(error, match=match) as info:
        open_checkpoint(path)
    assert str(path) in str(info.value)
    return info.value


def _safetensors_refuses(content: bytes) -> bool:
    try:
        st_load(content)
    except (SafetensorError, Exception):  # noqa: BLE001 - any refusal counts
        return True
    return False


CASES = {
    "overlap": ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, 12, "overlaps"),
    "gap": ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 12, 20)}, 20, "gap"),
    "first not at 0": ({"a": entry("F32", [2], 4, 12)}, 12, "gap after the data start"),
    "trailing bytes": ({"a": A8}, 12, "trailing"),
    "bool dim": ({"a": entry("F32", [True, 2], 0, 8)}, 8, "shape"),
    "float dim": ({"a": entry("F32", [2.0], 0, 8)}, 8, "shape"),
    "negative dim": ({"a": entry("F32", [-2], 0, 8)}, 8, "shape"),
    "bool offset": ({"a": entry("U8", [1], False, True)}, 1, "data_offsets"),
    "offsets reversed": ({"a": entry("F32", [0], 8, 0)}, 8, "data_offsets"),
    "three offsets": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 8]}}, 8,
                      "data_offsets"),
    "dtype list": ({"a": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}}, 8, "dtype"),
    "dtype object": ({"a": {"dtype": {"x": 1}, "shape": [2], "data_offsets": [0, 8]}}, 8,
                     "dtype"),
    "missing shape": ({"a": {"dtype": "F32", "data_offsets": [0, 8]}}, 8, "shape"),
    "huge dims": ({"a": entry("F32", [2**40, 2**40, 0], 0, 0)}, 0, "63 bits"),
    "dims just past 63 bits": ({"a": entry("U8", [2**61, 4], 0, 0)}, 0, "63 bits"),
    "dim past u64": ({"a": entry("F32", [0, 2**70], 0, 0)}, 0, "shape"),
    "metadata not strings": ({"__metadata__": {"format": 1}, "a": A8}, 8, "string"),
    "metadata list": ({"__metadata__": ["x"], "a": A8}, 8, "__metadata__"),
    "entry not object": ({"a": [1, 2]}, 0, "not an object"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rules_safetensors_enforces(tmp_path, name):
    header, size, match = CASES[name]
    content = raw_file(header, bytes(size))
    _refused(tmp_path, content, match=match)


@pytest.mark.parametrize("name", ["overlap", "gap", "first not at 0", "trailing bytes",
                                  "bool dim", "offsets reversed", "dtype list"])
def test_safetensors_itself_refuses_these_too(name):
    header, size, _ = CASES[name]
    assert _safetensors_refuses(raw_file(header, bytes(size)))


def test_duplicate_keys_are_refused_not_last_wins(tmp_path):
    """A second "a" would point at b's bytes: json keeps the last one silently."""
    text = ('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
            '"b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}, '
            '"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}')
    error = _refused(tmp_path, raw_file(text, bytes(16)), match="twice")
    assert error.key == "a"
    nested = '{"a": {"dtype": "F32", "dtype": "F16", "shape": [2], "data_offsets": [0, 8]}}'
    _refused(tmp_path, raw_file(nested, bytes(8)), match="twice")


def test_deep_json_is_typed_not_recursion_error(tmp_path):
    for depth in (MAX_DEPTH + 1, 100_000):
        text = '{"a": ' + "[" * depth + "]" * depth + "}"
        _refused(tmp_path, raw_file(text), match="nested")
    assert strict_json(b'{"a": "' + b"[" * 100 + b'"}', file="f") == {"a": "[" * 100}


def test_non_json_constants_and_encodings(tmp_path):
    nan = '{"a": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 0]}}'
    _refused(tmp_path, raw_file(nan))
    _refused(tmp_path, raw_file('{"a": 1e999}'))
    _refused(tmp_path, raw_file(b'{"\xff": 1}'), match="UTF-8")
    _refused(tmp_path, raw_file('{"a": 1'), match="JSON")
    _refused(tmp_path, raw_file("[1, 2]"), error=NotSafetensorsError)


def test_truncation_is_typed(tmp_path):
    header, data = good_pair()
    _refused(tmp_path, raw_file(header, data[:12]), error=TruncatedCheckpointError)
    _refused(tmp_path, raw_file(header)[:10], error=TruncatedCheckpointError)
    _refused(tmp_path, struct.pack("<Q", 2**63), error=NotSafetensorsError)


def test_valid_files_still_load_exactly(tmp_path):
    header, data = good_pair()
    header["__metadata__"] = {"format": "pt"}
    header["empty"] = entry("F32", [0, 3], 16, 16)  # zero-size tensors share an offset
    padded = json.dumps(header) + " " * 5  # writers pad the header with spaces
    path = write(tmp_path / "model.safetensors", raw_file(padded, data))
    out = load_tensors(path, {"a": torch.zeros(2), "b": torch.zeros(2),
                              "empty": torch.zeros(0, 3)})
    assert torch.equal(out["a"], torch.tensor([1.0, 2.0]))
    assert torch.equal(out["b"], torch.tensor([3.0, 4.0]))
    assert out["empty"].shape == (0, 3)


def test_every_refusal_is_a_checkpoint_error(tmp_path):
    for header, size, _ in CASES.values():
        path = write(tmp_path / "m.safetensors", raw_file(header, bytes(size)))
        with pytest.raises(CheckpointError):
            open_checkpoint(path)


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max([_depth(v) for v in value.values()] or [0])
    if isinstance(value, list):
        return 1 + max([_depth(v) for v in value] or [0])
    return 0


_json = st.recursive(st.one_of(st.none(), st.integers(), st.text(alphabet='[]{}"\\ab', max_size=6)),
                     lambda inner: st.one_of(st.lists(inner, max_size=3),
                                             st.dictionaries(st.text('[]{}"\\a', max_size=4),
                                                             inner, max_size=3)),
                     max_leaves=12)


@settings(max_examples=300, deadline=None, database=None)
@given(_json, st.integers(0, MAX_DEPTH + 2))
def test_json_depth_is_measured_exactly(value, wrap):
    """Depth is the value's nesting; brackets inside strings (escaped quotes included)
    never count, so strict JSON refuses exactly the texts nested past MAX_DEPTH."""
    depth = _depth(value)
    assert json_depth_ok(value, depth)
    assert depth == 0 or not json_depth_ok(value, depth - 1)
    raw = ("[" * wrap + json.dumps(value) + "]" * wrap).encode()
    if wrap + depth <= MAX_DEPTH:
        inner = strict_json(raw, file="f")
        for _ in range(wrap):
            [inner] = inner
        assert inner == value
    else:
        with pytest.raises(HeaderError, match="nested"):
            strict_json(raw, file="f")
