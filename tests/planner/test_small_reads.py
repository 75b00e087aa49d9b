"""Small integer tensors read at plan time (``weight_shape``'s values): a batch read in
runs per file, each entry's values those of its bytes, whatever the files, order, gaps
and dtypes; a float tensor or a file cut short refused, naming the tensor."""

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weightplan.errors import QuantizationError
from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.small_reads import INTEGER_CODES, SmallReader

DTYPES = list(INTEGER_CODES)


@st.composite
def _batches(draw):
    """Tensors of a few integer dtypes and lengths, laid out in up to three files with
    gaps of a few bytes to past a run's limit, some in memory; asked in a drawn order."""
    tensors = []
    for i in range(draw(st.integers(1, 30))):
        dtype = draw(st.sampled_from(DTYPES))
        count = draw(st.sampled_from([0, 1, 2, 3]))
        values = draw(st.lists(st.integers(0, 100), min_size=count, max_size=count))
        where = draw(st.sampled_from([0, 0, 1, 2, None]))
        gap = draw(st.sampled_from([0, 0, 3, 4096, 4097, 9000]))
        tensors.append((f"t{i}", dtype, values, where, gap))
    order = draw(st.permutations(range(len(tensors))))
    return tensors, order


@settings(max_examples=150, deadline=None)
@given(_batches())
def test_each_entry_reads_its_own_values(tmp_path_factory, batch):
    tensors, order = batch
    folder = tmp_path_factory.mktemp("small")
    data = {0: bytearray(), 1: bytearray(), 2: bytearray()}
    entries, memory, expected = [], {}, []
    for key, dtype, values, where, gap in tensors:
        spec = TensorSpec((len(values),), dtype)
        raw = struct.pack(f"<{len(values)}{INTEGER_CODES[dtype]}", *values)
        if where is None:
            memory[key] = torch.tensor(values, dtype=dtype)
            entries.append(TensorEntry(key, spec, None, 0))
        else:
            data[where] += bytes(gap)
            entries.append(TensorEntry(key, spec, str(folder / f"f{where}"), len(data[where])))
            data[where] += raw
        expected.append(tuple(values))
    for where, raw in data.items():
        (folder / f"f{where}").write_bytes(bytes(raw))
    asked = [entries[i] for i in order]
    with SmallReader(memory) as read:
        assert read(asked) == [expected[i] for i in order]


def test_a_float_tensor_and_a_file_cut_short_are_refused(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(struct.pack("<4q", 1, 2, 3, 4))
    ints = TensorEntry("a.weight_shape", TensorSpec((2,), torch.int64), str(path), 0)
    floats = TensorEntry("b.weight_shape", TensorSpec((2,), torch.float32), str(path), 16)
    short = TensorEntry("c.weight_shape", TensorSpec((2,), torch.int64), str(path), 24)
    with SmallReader(None) as read:
        assert read([ints]) == [(1, 2)]
        with pytest.raises(QuantizationError, match="b.weight_shape is not an integer"):
            read([ints, floats])
        with pytest.raises(QuantizationError, match="c.weight_shape is cut short"):
            read([short, ints])
