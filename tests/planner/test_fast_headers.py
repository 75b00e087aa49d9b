"""The header reader's two ways agree on every input.

:func:`~weightplan.planner.inputs.safetensors_format.header_columns` reads the writers'
layout column by column (``_writer_layout``) and anything else as strict JSON entry by
entry (``_any_layout``). The first may decline anything (the second then decides), but
what it accepts must be exactly what the second returns, and it must take every valid
header in the writers' layout. ``strict_json`` refuses exactly the texts a slow oracle
refuses, and the checkpoint's :class:`TensorEntry` keeps the value semantics of the
dataclass it replaced.
"""

from __future__ import annotations

import json
import pickle
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save, save_file

from weightplan.errors import CheckpointError, HeaderError, MissingShardError, UnsafePathError
from weightplan.planner.core.entry import FrozenEntryError, StridedEntry, TensorEntry
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.inputs.safetensors_format import (
    MAX_DEPTH, _any_layout, _writer_layout, header_columns, strict_json,
)
from weightplan.planner.core.spec import SAFETENSORS_DTYPES, TensorSpec

from tests.conftest import write_checkpoint
from tests.hostile.helpers import consistent_header

FAST = settings(max_examples=400, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
COMPACT = (",", ":")


def _both(raw: bytes, data_len: int):
    """(writer-layout, strict) readings of a header ``raw`` followed by ``data_len`` bytes;
    and the strict reading is what :func:`header_columns` returns or raises whenever the
    writer-layout reading declines."""
    data_start, size = 8 + len(raw), 8 + len(raw) + data_len
    fast = _writer_layout("f", raw, data_start, data_len, {})
    try:
        strict = _any_layout("f", raw, data_start, size, {})
    except CheckpointError as e:
        strict, error = None, e
    if fast is None:
        try:
            assert header_columns("f", raw, data_start, size) == strict
        except CheckpointError as e:
            assert strict is None and (type(e), str(e), e.key) == (
                type(error), str(error), error.key)
    return fast, strict


def _agree(raw: bytes, data_len: int) -> bool:
    """The fast reading, when there is one, is the strict one; returns whether it had one."""
    fast, strict = _both(raw, data_len)
    if fast is not None:
        assert strict is not None, raw
        assert fast == strict, raw
        assert list(fast[0]) == list(strict[0])  # same order
        assert header_columns("f", raw, 8 + len(raw), 8 + len(raw) + data_len) == fast
    return fast is not None


def _header(spec_list, meta) -> tuple[dict, int]:
    return consistent_header(spec_list, "t.{}", meta)


specs = st.lists(st.tuples(st.sampled_from(sorted(SAFETENSORS_DTYPES)),
                           st.lists(st.integers(0, 3), max_size=3)), min_size=1, max_size=5)
metas = st.one_of(st.none(), st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2))
edits = st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete", "dup"]),
                           st.integers(0, 10_000), st.sampled_from(b'"{}[],:\\ 0123456789aF\x01')),
                 max_size=3)


def _mutate(raw: bytes, ops) -> bytes:
    data = bytearray(raw)
    for op, at, value in ops:
        at = at % (len(data) + 1)
        if op == "flip" and at < len(data):
            data[at] = value
        elif op == "insert":
            data[at:at] = bytes([value])
        elif op == "delete":
            del data[at:at + 1]
        else:  # repeat a slice: duplicate keys, shifted offsets
            data[at:at] = data[at:at + 40]
    return bytes(data)


@FAST
@given(specs, metas, st.booleans(), st.booleans(), edits, st.sampled_from([0, 0, 1, -1]))
def test_fast_headers_agree_with_the_strict_reader(spec_list, meta, compact, reverse, ops, extra):
    header, data_len = _header(spec_list, meta)
    if reverse:
        header = dict(reversed(header.items()))
    raw = json.dumps(header, separators=COMPACT if compact else None).encode()
    took = _agree(_mutate(raw, ops), max(data_len + extra, 0))
    if not ops and not extra and compact and not reverse and len(spec_list) > 1 \
            and b"\\" not in raw:
        assert took  # a valid header in the writers' layout is read column by column


def test_safetensors_own_files_take_the_writer_layout():
    blob = save({"b": torch.ones(2, 3), "a": torch.zeros(5, dtype=torch.bfloat16),
                 "e": torch.zeros(0, 4)}, metadata={"format": "pt"})
    (n,) = struct.unpack("<Q", blob[:8])
    raw = blob[8:8 + n]
    fast = _writer_layout("f", raw, 8 + n, len(blob) - 8 - n, {})
    assert fast is not None and fast[2] == {"format": "pt"} and set(fast[0]) == {"a", "b", "e"}
    assert _agree(raw, len(blob) - 8 - n)


@pytest.mark.parametrize("text", [
    '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],'
    '"data_offsets":[0,8]}}',  # a key twice: refused, never last-wins
    '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],'
    '"data_offsets":[4,8]}}',  # ... even when both tile the data
    '{"__metadata__":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',  # not an entry
    '{"__metadata__":{"k":"v"},"__metadata__":{"k":"w"},'
    '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
    '{"__metadata__":null,"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
    '{"__metadata__":{"t":"12:00","k":"a:b"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
    '{"__metadata__":{"k":"a:b","k":"c"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
    '{"__metadata__": {"k":"a:b","k":"c"}, "a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
    '{"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
    '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}}',
    '{"a:b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',  # ':' in a key: strict path
    '{"a\\u0062":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',  # escapes: strict path
    '{"a\x01":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',  # raw control: refused
    '{"a":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}}',
    '{"a":{"dtype":"F32","shape":[2],"data_offsets":[00,8]}}',
    '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":[[[[1]]]]}}',
    '{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}',
    '{"a":{"dtype":"F64","shape":"","data_offsets":[0,8]}}',  # () only as a list
    '{"a":{"dtype":"F64","shape":{},"data_offsets":[0,8]}}',
    '{"a":{"dtype":"F64","shape":[],"data_offsets":"ab"}}',
    '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}}',
    '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},}',
    '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}}',
    '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}',
    '{"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],'
    '"data_offsets":[0,4]}}',  # out of order, still tiling
    '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],'
    '"data_offsets":[0,4]}}',  # overlap
    ' {"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}  \n',
])
def test_hand_picked_headers_agree(text):
    _agree(text.encode(), 8)


@pytest.mark.parametrize("dim", ["false", "0.0", "true", "1.0"])
def test_cached_specs_never_stand_in_for_bools_or_floats(dim):
    """``False == 0`` and ``1.0 == 1`` as dict keys: a spec cached for ``[0]`` or ``[1]``
    must not be found for ``[false]`` or ``[1.0]`` (the strict reader refuses them)."""
    good = 0 if dim in ("false", "0.0") else 1
    for compact in (True, False):
        sep = "" if compact else " "
        text = (f'{{"a":{sep}{{"dtype":"U8","shape":[{good}],"data_offsets":[0,{good}]}},'
                f'"b":{sep}{{"dtype":"U8","shape":[{dim}],"data_offsets":[{good},{2 * good}]}}}}')
        fast, strict = _both(text.encode(), 2 * good)
        assert fast is None and strict is None


def test_duplicates_are_still_refused_by_name(tmp_path):
    text = ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
            '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}').encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(8))
    with pytest.raises(HeaderError, match="twice") as info:
        open_checkpoint(path)
    assert info.value.key == "a"


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text("ab:\"\\", max_size=3)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text("ab:", max_size=2), inner, max_size=3)),
    max_leaves=10)


class _Pairs(list):
    """An object's pairs, as the text gives them (a duplicate key kept)."""


def _refuse(name):
    raise ValueError(name)


def _oracle(raw: bytes):
    """What strict JSON reads from ``raw``, told the long way round: the value, or
    ``None`` when the text is no UTF-8 JSON, uses NaN/Infinity, repeats a key in an
    object or nests deeper than MAX_DEPTH."""
    try:
        tree = json.loads(raw.decode("utf-8"), object_pairs_hook=_Pairs, parse_constant=_refuse)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None

    def value(node, depth):
        if isinstance(node, _Pairs | list) and depth > MAX_DEPTH:
            raise ValueError("deep")
        if isinstance(node, _Pairs):
            if len({k for k, _ in node}) != len(node):
                raise ValueError("twice")
            return {k: value(v, depth + 1) for k, v in node}
        if isinstance(node, list):
            return [value(v, depth + 1) for v in node]
        return node

    try:
        return ("ok", value(tree, 1))
    except ValueError:
        return None


@FAST
@given(json_values, st.booleans(), edits, st.integers(0, 70), st.sampled_from(["", "k", "a"]))
def test_strict_json_refuses_exactly_what_it_should(value, compact, ops, depth, twice):
    text = json.dumps(value, separators=COMPACT if compact else None)
    if twice:  # an object holding the value under a key given twice, or under two keys
        text = f'{{"k": {text}, "{twice}": {text}}}'
    raw = _mutate(("[" * depth + text + "]" * depth).encode(), ops)
    try:
        got = ("ok", strict_json(raw, file="f"))
    except HeaderError:
        got = None
    want = _oracle(raw)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)  # NaN != NaN


def test_tensor_entry_is_an_immutable_value():
    spec = TensorSpec((2, 3), torch.float32)
    entry = TensorEntry("a", spec, "f", 8)
    assert entry == TensorEntry("a", spec, "f", 8) and hash(entry) == hash(TensorEntry("a", spec, "f", 8))
    assert entry != TensorEntry("a", spec, "f", 16) and entry.nbytes == 24 and entry.contiguous
    with pytest.raises(FrozenEntryError):
        entry.offset = 0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del entry.key
    strided = TensorEntry("a", spec, None, contiguous=False)
    assert type(strided) is StridedEntry and not strided.contiguous
    assert strided != TensorEntry("a", spec, None) and TensorEntry("a", spec, None) != strided
    for e in (entry, strided):
        back = pickle.loads(pickle.dumps(e))
        assert back == e and type(back) is type(e) and back.contiguous == e.contiguous
    assert "offset=8" in repr(entry)


def test_in_memory_strided_tensors_keep_their_flag():
    ckpt = open_checkpoint({"t": torch.ones(4, 4).T, "c": torch.ones(2)})
    assert not ckpt.entries["t"].contiguous and ckpt.entries["c"].contiguous


def _sharded(tmp_path):
    d = write_checkpoint(tmp_path / "sh", {k: torch.ones(1) for k in "abcd"}, shards=2)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    return d, index


def _write_index(d, index) -> None:
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


def test_index_placing_a_key_in_the_wrong_shard(tmp_path):
    d, index = _sharded(tmp_path)
    first, second = sorted(set(index["weight_map"].values()))
    moved = next(k for k, v in index["weight_map"].items() if v == second)
    index["weight_map"][moved] = first  # the key exists, but in the other shard
    _write_index(d, index)
    with pytest.raises(HeaderError, match="index places this key here") as info:
        open_checkpoint(d)
    assert info.value.key == moved and first in str(info.value)


def test_index_errors_name_the_shard_and_its_keys(tmp_path):
    d, index = _sharded(tmp_path)
    index["weight_map"].update({"x": "gone.safetensors", "y": "gone.safetensors"})
    _write_index(d, index)
    with pytest.raises(MissingShardError, match=r"holding 'x' and 1 more keys"):
        open_checkpoint(d)
    index["weight_map"].update({"x": ["not", "a", "name"]})
    _write_index(d, index)
    with pytest.raises(UnsafePathError, match="not a file name"):
        open_checkpoint(d)


def test_a_key_in_two_files_names_the_first(tmp_path):
    save_file({"a": torch.ones(1), "b": torch.ones(1)}, str(tmp_path / "1.safetensors"))
    save_file({"c": torch.ones(1), "b": torch.ones(1)}, str(tmp_path / "2.safetensors"))
    with pytest.raises(HeaderError, match="also present in .*1.safetensors") as info:
        open_checkpoint(tmp_path)
    assert info.value.key == "b"


def test_files_share_one_spec_per_dtype_and_shape(tmp_path):
    d = write_checkpoint(tmp_path / "sh", {f"k{i}": torch.ones(3) for i in range(4)}, shards=2)
    specs = {id(e.spec) for e in open_checkpoint(d).entries.values()}
    assert len(specs) == 1


def _compact(header: dict) -> bytes:
    return json.dumps(header, separators=COMPACT).encode()


@FAST
@given(specs, metas, edits, st.sampled_from([0, 0, 1, -1]))
def test_mutated_writer_layouts_agree(spec_list, meta, ops, extra):
    """Small edits of the writers' layout (what the column reading must refuse or read
    exactly as the strict reading does); the unedited ones are read column by column."""
    header, data_len = _header(spec_list, meta)
    raw = _mutate(_compact(header), ops)
    took = _agree(raw, max(data_len + extra, 0))
    if not ops and not extra and len(spec_list) > 1 and b"\\" not in raw:
        assert took, raw


@pytest.mark.parametrize("text", [
    # a begin that only starts like the previous end, or spelled with a leading zero
    '{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[0],'
    '"data_offsets":[80,80]}}',
    '{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[0],'
    '"data_offsets":[08,8]}}',
    '{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[8],'
    '"data_offsets":[00,8]}}',
    # the first entry not at 0, the last not at the end, something between two entries
    '{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},"b":{"dtype":"U8","shape":[4],'
    '"data_offsets":[8,12]}}',
    '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],'
    '"data_offsets":[4,6]}}',
    '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]} ,"b":{"dtype":"U8","shape":[4],'
    '"data_offsets":[4,8]}}',
    '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"x":1,"b":{"dtype":"U8","shape":[4],'
    '"data_offsets":[4,8]}}',
    # a key twice, "__metadata__" as an entry, metadata hiding an entry, metadata last
    '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"a":{"dtype":"U8","shape":[4],'
    '"data_offsets":[4,8]}}',
    '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"__metadata__":{"dtype":"U8",'
    '"shape":[4],"data_offsets":[4,8]}}',
    '{"__metadata__":{"k":"v"},"z":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},'
    '"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],'
    '"data_offsets":[4,8]}}',
    '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],'
    '"data_offsets":[4,8]},"__metadata__":{"k":"v"}}',
    # shapes the strict reader refuses, dtypes it doesn't know, a shape hiding structure
    '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[false],'
    '"data_offsets":[4,4]}}',
    '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2.0],'
    '"data_offsets":[4,6]}}',
    '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"X9","shape":[4],'
    '"data_offsets":[4,8]}}',
    '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2,",2],'
    '"data_offsets":[4,8]}}',
    '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],'
    '"data_offsets":[4,8]}}  ',  # valid, trailing whitespace
    ' {"__metadata__":null,"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
    '"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}',  # valid
    # chained offsets whose spans are not the tensors' sizes
    '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],'
    '"data_offsets":[4,8]}}',
    '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],'
    '"data_offsets":[4,8]}}',
    # a raw control character in a key, more than the metadata before the first entry
    '{"a\x01":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],'
    '"data_offsets":[4,8]}}',
    '{"__metadata__":{"k":"v"},"x":1,"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
    '"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}',
    '{"__metadata__":{"k":"v","k":"w"},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
    '"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}',
    '{"__metadata__":{"k":1},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
    '"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}',
])
def test_hand_picked_chained_headers_agree(text):
    _agree(text.encode(), 8)


field_edits = st.lists(st.tuples(st.integers(0, 4), st.sampled_from(["dtype", "dim", "begin", "end"]),
                                 st.integers(-2, 2)), min_size=1, max_size=2)


@FAST
@given(specs, metas, field_edits)
def test_edited_fields_in_the_writer_layout_agree(spec_list, meta, edit_list):
    """A dtype, a dim or an offset changed in the writers' layout (the text stays in that
    layout): the column reading refuses what the strict reading refuses."""
    header, data_len = _header(spec_list, meta)
    names = [k for k in header if k != "__metadata__"]
    for which, what, delta in edit_list:
        info = header[names[which % len(names)]]
        if what == "dtype":
            dtypes = sorted(SAFETENSORS_DTYPES)
            info["dtype"] = dtypes[(dtypes.index(info["dtype"]) + delta) % len(dtypes)]
        elif what == "dim" and info["shape"]:
            info["shape"][0] = max(info["shape"][0] + delta, 0)
        elif what in ("begin", "end"):
            at = what == "end"
            info["data_offsets"][at] = max(info["data_offsets"][at] + delta, 0)
    _agree(_compact(header), data_len)


def test_a_huge_span_or_overlap_in_writer_layout_is_refused():
    for end in ("8", str(2**64 + 8), str(2**70)):
        text = ('{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8",'
                f'"shape":[0],"data_offsets":[8,{end}]}}}}')
        fast, strict = _both(text.encode(), 8)
        assert fast == strict and (fast is None) == (end != "8")


def test_sharded_reading_is_the_union_of_its_files(tmp_path):
    from weightplan.planner.inputs.checkpoint import read_header

    d = write_checkpoint(tmp_path / "sh", {f"k{i}": torch.ones(i + 1) for i in range(9)},
                         shards=3)
    ckpt = open_checkpoint(d)
    union = {}
    for stamp in ckpt.files:
        union.update(read_header(stamp.path)[0])
    assert ckpt.entries == union and len(union) == 9 and len(ckpt.files) == 3


def _raw_file(path, text: str, data: int) -> None:
    raw = text.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(data))


ONE = '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}'
MERGE_CASES = {  # the second file's header; the error: words, key, the file at fault
    "dup_in_file": ('{"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
                    '"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}',
                    "twice", "b", 1),
    "dup_across": ('{"c":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
                   '"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}',
                   "also present in .*m-1.safetensors", "a", 1),
    "metadata_key": ('{"c":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
                     '"__metadata__":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}',
                     "not a string", "__metadata__.shape", 1),
    "bad_second": ('{"c":{"dtype":"U8","shape":[false],"data_offsets":[0,8]}}',
                   "invalid shape", "c", 1),
    "index_then_bad": ('{"b":{"dtype":"U8","shape":[2.0],"data_offsets":[0,8]}}',
                       "index places this key here", "x", 0),
    "index_wrong": (ONE.replace('"a"', '"b"'), "index places this key here", "x", 0),
}


@pytest.mark.parametrize("case", sorted(MERGE_CASES))
def test_sharded_errors_name_the_first_file_at_fault(tmp_path, case):
    """Each file is read, checked against the index and against the earlier files in
    turn: the error (type, words, key) is that of the first file at fault."""
    second, match, key, at_fault = MERGE_CASES[case]
    placed = second[2]  # the second file's first key: the index places it there
    d = tmp_path / case
    d.mkdir()
    names = ["m-1.safetensors", "m-2.safetensors"]
    for name, text in zip(names, [ONE, second], strict=True):
        _raw_file(d / name, text, 8 if text.count("data_offsets") == 2 else 4)
    weight_map = {"a": names[0], placed: names[1]}
    if case.startswith("index"):
        weight_map["x"] = names[0]  # in no header: the first file is at fault
    (d / "m.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(HeaderError, match=match) as info:
        open_checkpoint(d)
    assert info.value.key == key and info.value.file == str(d / names[at_fault])


def test_long_digit_runs_take_linear_time():
    """The chained split starts at a comma, never inside a run of digits (from each of
    whose digits a match would be tried: quadratic time on a crafted header)."""
    import time

    for text in ('{"a":' + "1" * 300_000 + "}", '{"a":[,' + "1" * 300_000 + "]}"):
        start = time.process_time()
        assert _both(text.encode(), 0) == (None, None)
        assert time.process_time() - start < 2.0
