"""Thread stress: many small reads racing into shared destinations must land exactly."""

import sys

import torch

import weightplan
from weightplan import WeightConverter
from weightplan.ops import Concatenate, MergeModulelist

from tests.conftest import module_with, write_checkpoint


def test_many_threads_many_small_reads(tmp_path, monkeypatch):
    import weightplan.planner.tensors.schedule.schedule as schedule
    monkeypatch.setattr(schedule, "effective_threads", lambda threads: threads)  # > CPUs
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        g = torch.Generator().manual_seed(0)
        ckpt = {f"layer.{layer}.e.{e}.{w}": torch.randn(3, 5, generator=g)
                for layer in range(6) for e in range(16) for w in ("a", "b")}
        directory = write_checkpoint(tmp_path / "c", ckpt, shards=3)
        conv = WeightConverter(["e.*.a", "e.*.b"], "fused", [MergeModulelist(0), Concatenate(1)])
        for attempt in range(3):
            model = module_with({f"layer.{layer}.fused": ((16, 6, 5), torch.float32) for layer in range(6)})
            weightplan.load(model, directory, mapping=[conv], threads=8)
            for layer in range(6):
                want = torch.cat([torch.stack([ckpt[f"layer.{layer}.e.{e}.{w}"] for e in range(16)])
                                  for w in ("a", "b")], dim=1)
                assert torch.equal(getattr(model.layer, str(layer)).fused, want), (attempt, layer)
    finally:
        sys.setswitchinterval(old)


def _in_new_thread(fn):
    import threading

    out = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def test_the_merge_pool_holds_its_threads_at_one_and_leaves_torchs_counts():
    """A merge's pool: each of its threads runs torch on one intra-op thread; the calling
    thread's count and the count a thread started later takes are left as they were."""
    from weightplan.executor.intra_op import single_threaded_pool

    threads, default = torch.get_num_threads(), _in_new_thread(torch.get_num_threads)
    torch.set_num_threads(max(2, threads))
    try:
        pool = single_threaded_pool(3)
        try:
            seen = [pool.submit(torch.get_num_threads).result() for _ in range(6)]
        finally:
            pool.shutdown(wait=True)
        assert seen == [1] * 6
        assert torch.get_num_threads() == max(2, threads)
        assert _in_new_thread(torch.get_num_threads) == max(2, threads)  # (set just above)
    finally:
        torch.set_num_threads(threads)
        _in_new_thread(lambda: torch.set_num_threads(default))


def test_a_merge_pool_thread_that_fails_to_start_is_an_error_at_once(monkeypatch):
    """A pool thread whose set-up fails surfaces as a typed error naming the cause, without
    waiting for the start barrier's timeout (it was a bare BrokenBarrierError after 60 s)."""
    import threading

    import pytest

    from weightplan.errors import ExecutionError
    from weightplan.executor import intra_op

    calls = []

    def flaky() -> None:
        calls.append(threading.current_thread().name)
        if len(calls) == 2:
            raise RuntimeError("no OpenMP team for you")
        torch.set_num_threads(1)

    threads = torch.get_num_threads()
    monkeypatch.setattr(intra_op, "_one_thread", flaky)
    monkeypatch.setattr(intra_op, "START_TIMEOUT_S", 30.0)  # (a wait would end in a timeout)
    with pytest.raises(ExecutionError, match="no OpenMP team for you") as caught:
        intra_op.single_threaded_pool(3)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert torch.get_num_threads() == threads  # the caller's count untouched
