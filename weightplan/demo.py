"""The demo behind ``make demo`` / ``weightplan demo``: no network, no transformers.

It builds a small Mixtral-style model of weightplan's own (experts stacked in fused
``gate_up_proj`` / ``down_proj`` tensors), writes a checkpoint in the *legacy* layout
(one tensor per expert named ``w1``/``w2``/``w3`` under ``block_sparse_moe``, and
TF-era ``LayerNorm.gamma`` / ``.beta`` names) as two shards with an index, then explains
and loads it into a copy of the model built on ``meta`` and checks the outputs agree.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

import weightplan
from weightplan.errors import SaveError


@dataclass
class TinyMoEConfig:
    model_type: str = "mixtral"
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 4
    num_experts: int = 8
    top_k: int = 2


class Experts(nn.Module):
    def __init__(self, cfg: TinyMoEConfig):
        super().__init__()
        e, i, h = cfg.num_experts, cfg.intermediate_size, cfg.hidden_size
        self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * i, h) * h**-0.5)
        self.down_proj = nn.Parameter(torch.randn(e, h, i) * i**-0.5)

    def forward(self, x: torch.Tensor, expert: int) -> torch.Tensor:
        gate, up = (x @ self.gate_up_proj[expert].T).chunk(2, dim=-1)
        return (nn.functional.silu(gate) * up) @ self.down_proj[expert].T


class MoE(nn.Module):
    def __init__(self, cfg: TinyMoEConfig):
        super().__init__()
        self.top_k = cfg.top_k
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = Experts(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.gate(x).softmax(-1).topk(self.top_k, dim=-1)
        out = torch.zeros_like(x)
        for k in range(self.top_k):
            for expert in chosen[..., k].unique().tolist():
                mask = chosen[..., k] == expert
                out[mask] += weights[..., k][mask, None] * self.experts(x[mask], expert)
        return out


class Layer(nn.Module):
    def __init__(self, cfg: TinyMoEConfig):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size)
        self.mlp = MoE(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.LayerNorm(x))


class TinyMoE(nn.Module):
    """A Mixtral-style stack: embedding, MoE layers with LayerNorm, final norm, head."""

    def __init__(self, cfg: TinyMoEConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.LayerNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def legacy_state_dict(model: TinyMoE) -> dict[str, torch.Tensor]:
    """The model's tensors in the legacy per-expert layout."""
    out = {}
    inter = model.config.intermediate_size
    for name, tensor in model.state_dict().items():
        name = name.replace(".mlp.", ".block_sparse_moe.")
        name = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                           "LayerNorm.beta")
        if name.endswith("experts.gate_up_proj"):
            base = name.removesuffix("gate_up_proj")
            for e, fused in enumerate(tensor):
                out[f"{base}{e}.w1.weight"] = fused[:inter].clone()
                out[f"{base}{e}.w3.weight"] = fused[inter:].clone()
        elif name.endswith("experts.down_proj"):
            base = name.removesuffix("down_proj")
            for e, down in enumerate(tensor):
                out[f"{base}{e}.w2.weight"] = down.clone()
        else:
            out[name] = tensor.detach().clone()
    return out


def write_sharded(tensors: dict[str, torch.Tensor], directory: Path, shards: int = 2) -> None:
    """Write ``tensors`` as ``shards`` safetensors files plus the standard index."""
    keys = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k].contiguous() for k in keys[s::shards]}
        save_file(part, str(directory / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


TEMPORARY = "a temporary directory"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
          "model.safetensors.index.json")  # what write_sharded writes


def _demo_directory(path: Path) -> None:
    """Create ``path`` for the demo's checkpoint: new, empty, or a previous demo's.

    Raises:
        SaveError: a file, an unwritable path, or a directory holding other files (another
            checkpoint would be mixed with the demo's).
    """
    if path.exists() and not path.is_dir():
        raise SaveError(f"{path}: not a directory; give the demo a new or empty directory")
    others = sorted(p.name for p in path.iterdir() if p.name not in SHARDS) if path.exists() \
        else []
    if others:
        raise SaveError(f"{path} holds other files ({', '.join(others[:3])}"
                        f"{', ...' if len(others) > 3 else ''}); the demo writes its checkpoint "
                        "into a new or empty directory, or a previous demo's")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SaveError(f"{path}: can't create the demo's directory: {e.strerror}") from e


def _shown(text: str, ckpt: Path, directory: str | None) -> str:
    """``text`` with the temporary directory's path named as such: it is gone after the demo."""
    return text if directory else text.replace(str(ckpt), f"<{TEMPORARY}>")


def run_demo(directory: str | None = None) -> int:
    """Build, write, explain, load and check; returns a process exit code."""
    torch.manual_seed(0)
    cfg = TinyMoEConfig()
    source = TinyMoE(cfg).eval()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(directory or tmp)
        _demo_directory(ckpt)
        write_sharded(legacy_state_dict(source), ckpt)
        where = f"{ckpt}" if directory else f"{TEMPORARY} (deleted when the demo ends)"
        print(f"wrote a legacy Mixtral-style checkpoint to {where}\n")
        with weightplan.init_empty():
            model = TinyMoE(cfg).eval()
        plan = weightplan.explain(model, ckpt)
        print(_shown(str(plan), ckpt, directory))
        report = plan.execute(progress=False)
        print(_shown(str(report), ckpt, directory))
    ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        same = torch.equal(model(ids), source(ids))
    print(f"\nlogits of the loaded model equal the original's: {same}")
    if not directory:
        print("the temporary checkpoint is deleted; `weightplan demo --dir DIR` keeps it")
    return 0 if same else 1
