"""Hand-built safetensors bytes for adversarial tests (no library writer: we want bad files)."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def raw_file(header: dict | str | bytes, data: bytes = b"") -> bytes:
    """8-byte length + header (a dict is dumped as JSON) + data."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    return struct.pack("<Q", len(header)) + header + data


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def consistent_header(spec_list, name: str = "t{}", meta: dict | None = None
                      ) -> tuple[dict, int]:
    """A valid header for ``spec_list`` (safetensors dtype name, shape), tensors named
    ``name.format(i)`` and laid out back to back, and its data length."""
    from weightplan.planner.core.spec import SAFETENSORS_DTYPES

    header, start = ({"__metadata__": meta} if meta is not None else {}), 0
    for i, (dtype, shape) in enumerate(spec_list):
        n = SAFETENSORS_DTYPES[dtype].itemsize
        for d in shape:
            n *= d
        header[name.format(i)] = entry(dtype, shape, start, start + n)
        start += n
    return header, start


def good_pair() -> tuple[dict, bytes]:
    """Two f32[2] tensors, ``a`` then ``b``: a header and its 16 data bytes."""
    data = torch.tensor([1.0, 2.0, 3.0, 4.0]).numpy().tobytes()
    return {"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 8, 16)}, data


def write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def run_cli(*args: str, stdin: str = "", cwd: Path | None = None, env: dict | None = None
            ) -> subprocess.CompletedProcess:
    """``python -m weightplan.cli ARGS`` in a subprocess, stdin given."""
    import os

    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "weightplan.cli", *args], input=stdin,
                          capture_output=True, text=True, cwd=cwd, env=full_env, timeout=120)


def meta_model(specs: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A module with a meta parameter shaped like each tensor in ``specs`` (dotted names)."""
    root = torch.nn.Module()
    for name, value in specs.items():
        *path, attr = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        meta = torch.empty(value.shape, dtype=value.dtype, device="meta")
        module.register_parameter(attr, torch.nn.Parameter(meta, requires_grad=False))
    return root


def load_tensors(checkpoint, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Load ``checkpoint`` into a meta model shaped like ``like``; its state dict."""
    import weightplan

    model = meta_model(like)
    weightplan.explain(model, checkpoint).execute(strict=True)
    return {k: v.detach() for k, v in model.state_dict().items()}


@contextlib.contextmanager
def child_at_ready(script: str, *args: object, ready_on: str = "stdout",
                   **popen: object) -> Iterator[subprocess.Popen]:
    """``script`` (beside this file) run with ``args`` in a fresh interpreter, handed over
    once it has written ``ready`` on ``ready_on`` (``"stdout"`` or ``"stderr"``; the other
    of the two is dropped unless it is stderr); killed on the way out if still running."""
    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=str(here.parents[1]))
    child = subprocess.Popen([sys.executable, str(here / script), *map(str, args)],
                             stdout=subprocess.PIPE if ready_on == "stdout" else subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=env, **popen)  # type: ignore[call-overload]
    try:
        stream = child.stdout if ready_on == "stdout" else child.stderr
        assert stream is not None and stream.readline().strip() == "ready"
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
