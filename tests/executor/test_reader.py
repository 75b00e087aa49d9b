"""The read path: preadv straight into the destination for cold files, windows otherwise."""

import os

import pytest
import torch

import weightplan
from weightplan.errors import StaleCheckpointError, TruncatedCheckpointError
from weightplan.executor import reader as reader_module
from weightplan.executor.reader import Reader, evict, is_cached
from weightplan.planner.inputs.checkpoint import open_checkpoint

from tests.conftest import expected_moe, moe_model


def _file(tmp_path, nbytes=3 * 1024 * 1024 + 17):
    """8 filler bytes (the reader doesn't parse headers), then ``nbytes`` random bytes."""
    generator = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator)
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\x00" * 8 + data.numpy().tobytes())
    return path, data


class _Stamped:
    def __init__(self, path):
        from weightplan.planner.inputs.checkpoint import Checkpoint, FileStamp

        self.checkpoint = Checkpoint({}, (FileStamp.of(str(path)),))


def test_read_into_lands_the_exact_bytes_in_small_requests(tmp_path, monkeypatch):
    monkeypatch.setattr(reader_module, "REQUEST_BYTES", 1 << 20)  # several preadv calls
    path, data = _file(tmp_path)
    dest = torch.zeros(len(data) - 100, dtype=torch.uint8)
    with Reader(_Stamped(path).checkpoint) as reader:
        reader.read_into(str(path), 8 + 50, dest)
    assert torch.equal(dest, data[50:-50])


def test_a_file_truncated_under_the_reader_is_a_typed_error_not_sigbus(tmp_path, monkeypatch):
    # preadv needs no lease (nothing is mapped); without one this process may truncate
    monkeypatch.setattr(reader_module.LeaseGuard, "start", lambda self, fds: None)
    path, data = _file(tmp_path)
    dest = torch.zeros(1 << 20, dtype=torch.uint8)
    with pytest.raises(StaleCheckpointError):  # and closing the reader says the file changed
        with Reader(_Stamped(path).checkpoint) as reader:
            os.truncate(path, 8 + (1 << 19))  # half of the range is gone
            with pytest.raises(TruncatedCheckpointError) as info:
                reader.read_into(str(path), 8, dest)
    assert str(path) in str(info.value)


def test_evicted_file_is_seen_cold_and_a_read_file_warm(tmp_path):
    path, _ = _file(tmp_path)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        os.read(fd, size)
        assert is_cached(fd, size)
        evict(path)
        if is_cached(fd, size):
            pytest.skip("this filesystem keeps evicted pages (tmpfs?)")
        assert not is_cached(fd, size)
    finally:
        os.close(fd)


@pytest.mark.parametrize("threads", [0, 4])
def test_cold_load_reads_straight_into_the_model(moe_dir, monkeypatch, threads):
    directory, ckpt = moe_dir
    calls = []
    original = Reader.read_into
    monkeypatch.setattr(Reader, "reads_straight", lambda self, path: True)
    monkeypatch.setattr(Reader, "read_into",
                        lambda self, *a: calls.append(a[0]) or original(self, *a))
    model = moe_model()
    weightplan.load(model, directory, mapping="mixtral", threads=threads)
    got, want = model.state_dict(), expected_moe(ckpt)
    assert all(torch.equal(got[k], want[k]) for k in want)
    plan_files = {f.path for f in open_checkpoint(directory).files}
    assert calls and set(calls) <= plan_files
