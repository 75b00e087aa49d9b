"""Header-only frontier fixtures (benchmarks/frontier.py): key counts, layout, planning."""

import os

import pytest
import torch

import weightplan
from benchmarks.frontier import FIXTURES, fixture_keys, write_fixture
from weightplan.planner.inputs.checkpoint import open_checkpoint

PUBLISHED_KEYS = {"deepseek-v3-fp8": 91_991, "deepseek-v3-bf16": 46_183,
                  "qwen3-235b-a22b": 36_945, "llama-3.1-405b": 1_137}


@pytest.mark.parametrize("name", sorted(PUBLISHED_KEYS))
def test_full_size_key_counts_match_the_published_checkpoints(name):
    keys = fixture_keys(name)
    assert len(keys) == PUBLISHED_KEYS[name]
    assert len({k for k, _, _ in keys}) == len(keys)


def test_deepseek_fp8_has_block_scales_and_the_mtp_layer():
    keys = {k: (d, s) for k, d, s in fixture_keys("deepseek-v3-fp8", layers=4)}
    assert keys["model.layers.3.mlp.experts.255.down_proj.weight"] == ("F8_E4M3", (7168, 2048))
    assert keys["model.layers.3.mlp.experts.255.down_proj.weight_scale_inv"] == ("F32", (56, 16))
    assert keys["model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"] == ("F32", (5, 56))
    assert keys["model.layers.4.eh_proj.weight"] == ("BF16", (7168, 14336))  # MTP, after 0..3


def test_sparse_shards_hold_headers_only_and_plan(tmp_path):
    directory = write_fixture("deepseek-v3-fp8", tmp_path, layers=4)
    ckpt = open_checkpoint(directory)
    shards = sorted(directory.glob("*.safetensors"))
    assert len(shards) == FIXTURES["deepseek-v3-fp8"][2]
    assert len(ckpt) == len(fixture_keys("deepseek-v3-fp8", layers=4))
    apparent = sum(os.path.getsize(s) for s in shards)
    assert apparent > ckpt.nbytes > 25 * 2**30  # 5 layers of DeepSeek-V3 FP8: 30 GiB
    assert sum(os.stat(s).st_blocks * 512 for s in shards) < 64 * 2**20  # holes on disk
    assert ckpt.entries["model.layers.3.mlp.experts.7.up_proj.weight"].spec.dtype == \
        torch.float8_e4m3fn
    plan = weightplan.explain(None, directory, mapping="deepseek_v3")
    assert ".mlp.experts.gate_up_proj" in str(plan) and not plan.problems
