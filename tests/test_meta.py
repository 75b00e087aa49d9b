"""``init_empty()``: parameters are never allocated nor initialized, buffers stay real."""

import time

import torch
from torch import nn

import weightplan


class Big(nn.Module):
    """A parameter too big to allocate here (16 TiB), buffers made from sizes and values."""

    def __init__(self):
        super().__init__()
        self.huge = nn.Parameter(torch.empty(1 << 20, 1 << 20, 4))
        self.proj = nn.Linear(8, 8)
        self.register_buffer("mask", torch.ones(4, 4).bool(), persistent=False)
        self.scale = nn.Buffer(torch.full((3,), 2.0), persistent=False)
        self.register_buffer("steps", torch.arange(5), persistent=False)
        self.register_buffer("table", torch.zeros(3, 2).add(1), persistent=False)
        self.big = nn.Buffer(torch.full((1 << 17,), 3.0), persistent=False)  # made again


def test_parameters_go_to_meta_without_being_allocated():
    with weightplan.init_empty():  # allocating 16 TiB would raise
        model = Big()
    assert all(p.is_meta for p in model.parameters())
    assert model.huge.shape == (1 << 20, 1 << 20, 4) and model.huge.requires_grad
    assert isinstance(model.proj.weight, nn.Parameter)


def test_buffers_are_real_with_the_values_init_gave_them():
    with weightplan.init_empty():
        model = Big()
    assert torch.equal(model.scale, torch.full((3,), 2.0))
    assert torch.equal(model.steps, torch.arange(5))
    assert torch.equal(model.mask, torch.ones(4, 4).bool())
    assert torch.equal(model.table, torch.ones(3, 2))
    assert torch.equal(model.big, torch.full((1 << 17,), 3.0))
    with torch.device("meta"):  # outside the block nothing is redirected any more
        assert torch.zeros(2).is_meta
    assert not torch.zeros(2).is_meta and nn.Module.register_buffer is not None


def test_include_buffers_puts_everything_on_meta():
    with weightplan.init_empty(include_buffers=True):
        model = Big()
    assert all(b.is_meta for b in model.buffers())


def test_building_deepseek_v3_costs_about_what_meta_costs():
    transformers = __import__("transformers")
    cls, cfg = transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config()  # 671B
    start = time.perf_counter()
    with weightplan.init_empty():
        model = cls(cfg)
    seconds = time.perf_counter() - start
    assert sum(p.numel() for p in model.parameters()) > 600e9
    assert all(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())
    assert seconds < 10  # < 1 s on an idle machine (0.24 s, torch.device("meta"): 0.17 s)
