"""Shared test helpers: build modules with given tensor names, write checkpoints."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from weightplan.ops import ConversionOp
from weightplan.viz.dot import find_dot

# Rendering tests need graphviz's `dot`. CI (`.ci/run`, which sets CI=1) installs it, so
# there a missing `dot` fails the tests; on a developer machine without it they are skipped.
needs_dot = pytest.mark.skipif(find_dot() is None and not os.environ.get("CI"),
                               reason="graphviz `dot` is not installed (apt-get install graphviz)")


def module_with(specs: dict[str, tuple[tuple[int, ...], torch.dtype] | torch.Tensor],
                device: str = "meta", buffers: tuple[str, ...] = ()) -> nn.Module:
    """A module tree with a parameter (or buffer) at every dotted name in ``specs``."""
    root = nn.Module()
    for name, spec in specs.items():
        *path, attr = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        if isinstance(spec, torch.Tensor):
            tensor = spec.to(device)
        else:
            shape, dtype = spec
            tensor = torch.empty(shape, dtype=dtype, device=device)
        if name in buffers:
            module.register_buffer(attr, tensor)
        else:
            module.register_parameter(attr, nn.Parameter(tensor, requires_grad=tensor.is_floating_point()))
    return root


def write_checkpoint(directory: Path, tensors: dict[str, torch.Tensor], shards: int = 1) -> Path:
    """Write safetensors shards (+ index when sharded); returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    keys = sorted(tensors)
    if shards == 1:
        save_file({k: tensors[k].contiguous() for k in keys}, str(directory / "model.safetensors"))
        return directory
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k].contiguous() for k in keys[s::shards]}
        save_file(part, str(directory / name))
        weight_map.update({k: name for k in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return directory


def moe_checkpoint(layers: int = 2, experts: int = 4, inter: int = 6, hidden: int = 8,
                   dtype: torch.dtype = torch.float32, seed: int = 0) -> dict[str, torch.Tensor]:
    """A legacy Mixtral-style checkpoint dict (per-expert w1/w2/w3 + LayerNorm.gamma/beta)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for layer in range(layers):
        base = f"model.layers.{layer}"
        for e in range(experts):
            for w, shape in (("w1", (inter, hidden)), ("w3", (inter, hidden)), ("w2", (hidden, inter))):
                out[f"{base}.block_sparse_moe.experts.{e}.{w}.weight"] = torch.randn(*shape, generator=g).to(dtype)
        out[f"{base}.block_sparse_moe.gate.weight"] = torch.randn(experts, hidden, generator=g).to(dtype)
        out[f"{base}.LayerNorm.gamma"] = torch.randn(hidden, generator=g).to(dtype)
        out[f"{base}.LayerNorm.beta"] = torch.randn(hidden, generator=g).to(dtype)
    out["model.embed_tokens.weight"] = torch.randn(16, hidden, generator=g).to(dtype)
    return out


def moe_model(layers: int = 2, experts: int = 4, inter: int = 6, hidden: int = 8,
              dtype: torch.dtype = torch.float32, device: str = "meta") -> nn.Module:
    specs = {"model.embed_tokens.weight": ((16, hidden), dtype)}
    for layer in range(layers):
        base = f"model.layers.{layer}"
        specs[f"{base}.mlp.experts.gate_up_proj"] = ((experts, 2 * inter, hidden), dtype)
        specs[f"{base}.mlp.experts.down_proj"] = ((experts, hidden, inter), dtype)
        specs[f"{base}.mlp.gate.weight"] = ((experts, hidden), dtype)
        specs[f"{base}.LayerNorm.weight"] = ((hidden,), dtype)
        specs[f"{base}.LayerNorm.bias"] = ((hidden,), dtype)
    return module_with(specs, device)


def expected_moe(ckpt: dict[str, torch.Tensor], layers: int = 2, experts: int = 4
                 ) -> dict[str, torch.Tensor]:
    """What a correct load of :func:`moe_checkpoint` puts in :func:`moe_model`."""
    out = {"model.embed_tokens.weight": ckpt["model.embed_tokens.weight"]}
    for layer in range(layers):
        src, dst = f"model.layers.{layer}.block_sparse_moe", f"model.layers.{layer}"
        w = {n: torch.stack([ckpt[f"{src}.experts.{e}.{n}.weight"] for e in range(experts)])
             for n in ("w1", "w2", "w3")}
        out[f"{dst}.mlp.experts.gate_up_proj"] = torch.cat([w["w1"], w["w3"]], dim=1)
        out[f"{dst}.mlp.experts.down_proj"] = w["w2"]
        out[f"{dst}.mlp.gate.weight"] = ckpt[f"{src}.gate.weight"]
        out[f"{dst}.LayerNorm.weight"] = ckpt[f"model.layers.{layer}.LayerNorm.gamma"]
        out[f"{dst}.LayerNorm.bias"] = ckpt[f"model.layers.{layer}.LayerNorm.beta"]
    return out


class Doubler(ConversionOp):
    """A user op that can't place: its inputs are read into temporaries, it allocates its
    output, and it runs on materialized tensors."""

    def forward(self, streams):
        return tuple(tuple(t * 2 for t in s) for s in streams)

    def inverse(self):
        raise NotImplementedError


@pytest.fixture
def moe_dir(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    ckpt = moe_checkpoint()
    return write_checkpoint(tmp_path / "ckpt", ckpt, shards=2), ckpt


def legacy_of(state: dict[str, torch.Tensor], layers: int = 2, experts: int = 4
              ) -> dict[str, torch.Tensor]:
    """The inverse of :func:`expected_moe`, written independently of weightplan."""
    out = {"model.embed_tokens.weight": state["model.embed_tokens.weight"]}
    for layer in range(layers):
        src, dst = f"model.layers.{layer}", f"model.layers.{layer}.block_sparse_moe"
        gate_up = state[f"{src}.mlp.experts.gate_up_proj"]
        inter = gate_up.shape[1] // 2
        for e in range(experts):
            out[f"{dst}.experts.{e}.w1.weight"] = gate_up[e, :inter]
            out[f"{dst}.experts.{e}.w3.weight"] = gate_up[e, inter:]
            out[f"{dst}.experts.{e}.w2.weight"] = state[f"{src}.mlp.experts.down_proj"][e]
        out[f"{dst}.gate.weight"] = state[f"{src}.mlp.gate.weight"]
        out[f"{src}.LayerNorm.gamma"] = state[f"{src}.LayerNorm.weight"]
        out[f"{src}.LayerNorm.beta"] = state[f"{src}.LayerNorm.bias"]
    return out


# files opened during a call, by name (``opens``): an audit hook, added once per process
_WATCHED: list[Counter] = []  # the counter of the call being watched, if any
_HOOKED: list = []  # the hook, once added (for this process)


def _hook(event: str, args: tuple) -> None:
    if _WATCHED and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _WATCHED[-1][os.path.basename(os.fsdecode(args[0]))] += 1


@pytest.fixture(scope="module")
def opens():
    """Counts every open of a file by its name, whatever opens it (weightplan, transformers):
    an audit hook sees ``open``, ``io.open`` and ``os.open`` alike."""
    if _hook not in _HOOKED:
        sys.addaudithook(_hook)  # (a hook can't be removed: it counts only while watched)
        _HOOKED.append(_hook)

    class Watch:
        def __enter__(self) -> Counter:
            _WATCHED.append(Counter())
            return _WATCHED[-1]

        def __exit__(self, *exc: object) -> None:
            _WATCHED.pop()

    return Watch
