"""Plans the picture tests draw: small, in memory (no paths in the output), deterministic."""

from __future__ import annotations

import torch

import weightplan
from weightplan import WeightConverter
from weightplan.ops import Chunk

from tests.conftest import module_with, moe_checkpoint, moe_model

HIDDEN, INTER, EXPERTS, LAYERS = 2, 3, 2, 2


def small_plan(**kwargs):
    """Two MoE layers (renames, a merge + concat, a merge), a fused qkv split by Chunk, a
    shape mismatch, a missing and an unexpected tensor."""
    ckpt = moe_checkpoint(layers=LAYERS, experts=EXPERTS, inter=INTER, hidden=HIDDEN)
    ckpt["model.attn.qkv.weight"] = torch.ones(3 * HIDDEN, HIDDEN)
    ckpt["model.norm.weight"] = torch.ones(HIDDEN)
    ckpt["model.stray.bias"] = torch.ones(1)
    specs = {name: (tuple(p.shape), p.dtype) for name, p in moe_model(
        layers=LAYERS, experts=EXPERTS, inter=INTER, hidden=HIDDEN).named_parameters()}
    specs.update({f"model.attn.{x}.weight": ((HIDDEN, HIDDEN), torch.float32) for x in "qkv"})
    specs["model.norm.weight"] = ((HIDDEN + 1,), torch.float32)  # mismatch
    specs["model.lm_head.weight"] = ((4, HIDDEN), torch.float32)  # missing
    qkv = WeightConverter("attn.qkv.weight", ["attn.q.weight", "attn.k.weight", "attn.v.weight"],
                          operations=[Chunk(0)])
    mapping = [*weightplan.get_mapping("mixtral"), qkv]
    return weightplan.explain(module_with(specs), ckpt, mapping=mapping, **kwargs)


def deep_plan(layers: int = 60, experts: int = 8, **kwargs):
    """A many-layer legacy Mixtral-style plan with tiny tensors."""
    ckpt = moe_checkpoint(layers=layers, experts=experts, inter=2, hidden=2)
    model = moe_model(layers=layers, experts=experts, inter=2, hidden=2)
    return weightplan.explain(model, ckpt, mapping="mixtral", **kwargs)
