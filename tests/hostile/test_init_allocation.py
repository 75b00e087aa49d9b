"""Issue 21 item 14: missing tensors too large for the machine are refused before the load
allocates them.

A config whose checkpoint lacks 3 × 64 GiB of tensors made the load allocate them for the
model's init and end in UnexpectedError (or in the OOM killer, where memory is
overcommitted). The load compares what it would allocate with the machine first. The load
runs in a child limited to 16 GiB of address space, so the old behaviour can't take the
machine down.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import torch
from safetensors.torch import save_file

from .helpers import REPO

CHILD = """
import sys, torch, weightplan
model = torch.nn.Module()
model.small = torch.nn.Linear(4, 8, bias=False, device="meta")
for i in range(3):  # 2**34 float32 = 64 GiB each, absent from the checkpoint
    model.add_module(f"huge{i}", torch.nn.Linear(2**17, 2**17, bias=False, device="meta"))
plan = weightplan.explain(model, sys.argv[1])
try:
    plan.execute()
    print("loaded")
except weightplan.WeightplanError as e:
    print(type(e).__name__, e)
small = torch.nn.Module()
small.small = torch.nn.Linear(4, 8, bias=False, device="meta")
small.extra = torch.nn.Linear(4, 8, bias=False, device="meta")  # missing, but small
weightplan.explain(small, sys.argv[1]).execute()
print("small", small.extra.weight.is_meta, small.extra.weight.abs().sum().item() > 0)
"""


def test_missing_tensors_larger_than_the_machine_are_refused_before_allocating(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"small.weight": torch.randn(8, 4)}, str(path))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))

    result = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                            text=True, timeout=300, preexec_fn=limit,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    refused, small = result.stdout.splitlines()[-2:] if result.stdout else ("", "")
    assert refused.startswith("BudgetError"), result.stdout + result.stderr
    assert "lacks 3 tensors" in refused and "192 GiB" in refused, refused
    assert "huge0.weight (64 GiB)" in refused and "nothing was allocated" in refused
    assert small == "small False True"  # a small missing tensor is still initialized
