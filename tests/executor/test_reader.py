"""The read path: preadv straight into the destination for cold files, windows otherwise."""

import errno
import os

import pytest
import torch

import weightplan
from weightplan.errors import ExecutionError, StaleCheckpointError, TruncatedCheckpointError
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


def test_copy_into_copies_file_to_file_or_says_it_cannot(tmp_path, monkeypatch):
    path, data = _file(tmp_path)
    out = tmp_path / "out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with Reader(_Stamped(path).checkpoint) as reader:
            assert reader.copy_into(str(path), 8 + 50, len(data) - 100, fd, 3, str(out))

            def full(*args):
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr(os, "copy_file_range", full)
            with pytest.raises(ExecutionError, match=f"into {out} at byte 0 failed: .*space"):
                reader.copy_into(str(path), 8, 10, fd, 0, str(out))

            def refuse(*args):
                raise OSError(errno.EXDEV, "cross-device link")

            monkeypatch.setattr(os, "copy_file_range", refuse)  # (another filesystem)
            assert not reader.copy_into(str(path), 8, 10, fd, 0, str(out))  # nothing copied
    finally:
        os.close(fd)
    assert out.read_bytes() == b"\x00" * 3 + data[50:-50].numpy().tobytes()


def test_a_copy_from_a_truncated_file_is_a_typed_error(tmp_path, monkeypatch):
    monkeypatch.setattr(reader_module.LeaseGuard, "start", lambda self, fds: None)
    path, _ = _file(tmp_path)
    fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(StaleCheckpointError):
            with Reader(_Stamped(path).checkpoint) as reader:
                os.truncate(path, 8 + (1 << 19))
                with pytest.raises(TruncatedCheckpointError) as info:
                    reader.copy_into(str(path), 8, 1 << 20, fd, 0, "out")
    finally:
        os.close(fd)
    assert str(path) in str(info.value)


def test_direct_reads_into_files_land_alike_copied_by_the_kernel_or_not(moe_dir, tmp_path,
                                                                        monkeypatch):
    """A direct read into a file (a converted shard's merged experts here; a streamed
    offload file alike) is copied file to file by ``copy_file_range``; where the kernel
    can't (another filesystem), out of a window: the same bytes."""
    directory, _ = moe_dir
    copied = []
    kernel = os.copy_file_range

    def counted(*args):
        copied.append(args[2])
        return kernel(*args)

    monkeypatch.setattr(os, "copy_file_range", counted)
    weightplan.explain_convert(directory, tmp_path / "kernel", mapping="mixtral").execute()
    assert copied

    def refuse(*args):
        raise OSError(errno.EXDEV, "cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    weightplan.explain_convert(directory, tmp_path / "window", mapping="mixtral").execute()
    names = sorted(p.name for p in (tmp_path / "kernel").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "window").iterdir())
    for name in names:
        assert (tmp_path / "kernel" / name).read_bytes() == \
            (tmp_path / "window" / name).read_bytes(), name
