"""transformers as the oracle: tiny configs, checkpoint rewriting, the equality check."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import weightplan


def save(cls, cfg, directory: Path, *, original_format: bool = True, seed: int = 0) -> Path:
    """A tiny random ``cls(cfg)`` written by its own ``save_pretrained``."""
    torch.manual_seed(seed)
    cls(cfg).save_pretrained(directory, save_original_format=original_format)
    return directory


def rewrite(source: Path, target: Path, rename: Callable[[str], str] = lambda k: k,
            change: Callable[[str, torch.Tensor], torch.Tensor] = lambda k, v: v) -> Path:
    """Copy a single-file checkpoint directory, every key through ``rename`` and every
    tensor through ``change``."""
    target.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(source / "model.safetensors"))
    save_file({rename(k): change(k, v).contiguous() for k, v in tensors.items()},
              str(target / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(source / "config.json", target / "config.json")
    return target


def keys(directory: Path) -> set[str]:
    header = (directory / "model.safetensors").read_bytes()
    size = int.from_bytes(header[:8], "little")
    return set(json.loads(header[8:8 + size])) - {"__metadata__"}


def load_both(cls, cfg, reference_dir: Path, checkpoint_dir: Path | None = None):
    """``from_pretrained(reference_dir)`` and weightplan's load of ``checkpoint_dir``.

    Returns ``(model, reference, plan)``; asserts the plan has no problems first.
    """
    reference = cls.from_pretrained(reference_dir, dtype=torch.float32).eval()
    with weightplan.init_empty():
        model = cls(cfg).eval()
    plan = weightplan.explain(model, checkpoint_dir or reference_dir)
    assert not plan.missing and not plan.unexpected and not plan.mismatched, str(plan)
    assert not plan.problems, str(plan)
    plan.execute()
    return model, reference, plan


def assert_same(model, reference, inputs: dict) -> None:
    """Every parameter and buffer equal, and the logits of one forward pass."""
    expected, got = reference.state_dict(), model.state_dict()
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, reference(**inputs).logits)
