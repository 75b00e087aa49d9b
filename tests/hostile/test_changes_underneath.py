"""Deliverables 5 and 7: files changing under a plan, and failed loads into allocated models.

A file truncated, replaced or rewritten between explain() and the end of execute() gives
a typed error and no wrong bytes (the header itself is fingerprinted, not only size and
mtime). A failed load into allocated tensors either leaves them untouched
(``atomic=True``) or raises PartialLoadError listing exactly the tensors it overwrote.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

import weightplan

from weightplan.errors import ExecutionError, PartialLoadError, StaleCheckpointError
from weightplan.executor import reader as reader_mod

from .helpers import meta_model, raw_file

KEYS = ("a", "b", "c")
DATA = {k: torch.full((4, 4), float(i + 1)) for i, k in enumerate(KEYS)}


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(DATA, str(path))
    return path


def _swapped_header(path) -> bytes:
    """The same file with a's and b's offsets swapped: same size, same header length."""
    content = path.read_bytes()
    n = int.from_bytes(content[:8], "little")
    header = json.loads(content[8:8 + n])
    header["a"]["data_offsets"], header["b"]["data_offsets"] = (
        header["b"]["data_offsets"], header["a"]["data_offsets"])
    text = json.dumps(header, separators=(",", ":")).encode()
    return raw_file(text.ljust(n), content[8 + n:])


def test_rewrite_with_same_size_and_mtime_is_stale(ckpt):
    model = meta_model(DATA)
    plan = weightplan.explain(model, ckpt)
    st = os.stat(ckpt)
    swapped = _swapped_header(ckpt)
    assert len(swapped) == st.st_size
    ckpt.write_bytes(swapped)
    os.utime(ckpt, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(StaleCheckpointError, match="header bytes|change time"):
        plan.execute()
    assert all(p.is_meta for p in model.parameters())


def test_header_digest_alone_catches_a_rewrite(ckpt, monkeypatch):
    """Even where ctime can't be trusted, the header's own digest differs."""
    from weightplan.planner.inputs import fingerprint

    before = fingerprint.FileStamp.of(str(ckpt))
    ckpt.write_bytes(_swapped_header(ckpt))
    after = fingerprint.FileStamp.of(str(ckpt))
    assert "header bytes" in before.differences(after)


@pytest.mark.parametrize("change", ["truncate", "replace", "delete", "fifo"])
def test_changed_between_explain_and_execute(ckpt, tmp_path, change):
    model = meta_model(DATA)
    plan = weightplan.explain(model, ckpt)
    if change == "truncate":
        os.truncate(ckpt, os.path.getsize(ckpt) - 8)
    elif change == "replace":
        other = tmp_path / "other.safetensors"
        save_file({k: v * 7 for k, v in DATA.items()}, str(other))
        os.replace(other, ckpt)
    elif change == "delete":
        ckpt.unlink()
    else:
        ckpt.unlink()
        os.mkfifo(ckpt)
    with pytest.raises(StaleCheckpointError) as info:
        plan.execute()
    assert str(ckpt) in str(info.value) and "explain() again" in str(info.value)
    assert all(p.is_meta for p in model.parameters())


def _rewrite_after_first_read(monkeypatch, path, action):
    """Run ``action`` right after the first window is copied (threads=0: deterministic)."""
    original = reader_mod.Reader.window
    calls = []

    def window(self, *args):
        calls.append(args)
        if len(calls) == 2:
            action()
        return original(self, *args)

    monkeypatch.setattr(reader_mod.Reader, "window", window)


def _allocated_model():
    model = meta_model(DATA)
    for k in KEYS:
        model._parameters[k] = torch.nn.Parameter(torch.zeros(4, 4), requires_grad=False)
    return model


def test_header_rewritten_during_execute_is_caught_before_commit(ckpt, monkeypatch):
    model = meta_model(DATA)
    plan = weightplan.explain(model, ckpt, threads=0)
    _rewrite_after_first_read(monkeypatch, ckpt, lambda: ckpt.write_bytes(_swapped_header(ckpt)))
    with pytest.raises(StaleCheckpointError, match="during the load"):
        plan.execute()
    assert all(p.is_meta for p in model.parameters())


def _fail_on_second_read(monkeypatch):
    def boom():
        raise OSError(5, "injected read failure")

    _rewrite_after_first_read(monkeypatch, None, boom)


def test_failed_load_lists_exactly_the_overwritten_tensors(ckpt, monkeypatch):
    model = _allocated_model()
    plan = weightplan.explain(model, ckpt, threads=0)
    _fail_on_second_read(monkeypatch)
    with pytest.raises(PartialLoadError) as info:
        plan.execute()
    changed = {k for k in KEYS if not torch.equal(model.get_parameter(k), torch.zeros(4, 4))}
    assert changed and set(info.value.overwritten) == changed
    assert isinstance(info.value.__cause__, ExecutionError)
    assert "atomic=True" in str(info.value)


def test_atomic_execute_touches_nothing_on_failure(ckpt, monkeypatch):
    model = _allocated_model()
    plan = weightplan.explain(model, ckpt, threads=0)
    assert plan.atomic_bytes == sum(v.nbytes for v in DATA.values())
    assert "atomic=True" in str(plan)
    assert plan.to_dict()["atomic_bytes"] == plan.atomic_bytes
    _fail_on_second_read(monkeypatch)
    with pytest.raises(ExecutionError) as info:
        plan.execute(atomic=True)
    assert not isinstance(info.value, PartialLoadError)
    assert all(torch.equal(model.get_parameter(k), torch.zeros(4, 4)) for k in KEYS)


def test_atomic_execute_loads_exactly_when_nothing_fails(ckpt):
    model = _allocated_model()
    weightplan.explain(model, ckpt).execute(atomic=True)
    assert all(torch.equal(model.get_parameter(k), DATA[k]) for k in KEYS)
    again = _allocated_model()
    weightplan.load(again, ckpt, atomic=True)
    assert all(torch.equal(again.get_parameter(k), DATA[k]) for k in KEYS)


def test_failure_before_any_write_is_not_partial(ckpt):
    model = _allocated_model()
    plan = weightplan.explain(model, ckpt)
    os.truncate(ckpt, 100)
    with pytest.raises(StaleCheckpointError):
        plan.execute()
    assert all(torch.equal(model.get_parameter(k), torch.zeros(4, 4)) for k in KEYS)
