"""Issue 21 item 10: more checkpoint files than the process may open is said as such.

300 shards under ``ulimit -n 256`` used to fail as ``StaleCheckpointError "the file
changed"``. A child process with that limit loads (and saves) 300 shards: a typed error
that names the limit and how to raise it.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import torch

import weightplan

HERE = Path(__file__).resolve().parent
CHILD = """
import sys, torch, weightplan
sys.path.insert(0, {here!r})
from helpers import meta_model
like = {{f"t{{i}}": torch.zeros(2) for i in range(300)}}
for what in ("load", "save"):
    try:
        if what == "load":
            weightplan.load(meta_model(like), {ckpt!r}, threads=0)
        else:
            real = torch.nn.Module()
            for key, value in like.items():
                real.register_parameter(key, torch.nn.Parameter(value))
            weightplan.save(real, {out!r}, max_shard_size=8, threads=0, progress=False)
        print(what, "worked")
    except weightplan.WeightplanError as e:
        print(what, type(e).__name__, e)
"""


def test_more_shards_than_the_open_file_limit(tmp_path):
    ckpt = tmp_path / "ckpt"
    model = torch.nn.Module()
    for i in range(300):
        model.register_parameter(f"t{i}", torch.nn.Parameter(torch.full((2,), float(i))))
    weightplan.save(model, ckpt, max_shard_size=8, threads=0, progress=False)
    assert len([n for n in os.listdir(ckpt) if n.endswith(".safetensors")]) == 300

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))

    code = CHILD.format(here=str(HERE), ckpt=str(ckpt), out=str(tmp_path / "out"))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(HERE.parents[1])),
                            preexec_fn=limit, timeout=300)
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout + result.stderr
    load, save = lines
    assert load.startswith("load OpenFileLimitError") and "300 files" in load, load
    assert "ulimit -n" in load and "may have 256 files open" in load, load
    assert save.startswith("save SaveError") and "ulimit -n" in save, save
    assert not (tmp_path / "out").exists() or not [
        n for n in os.listdir(tmp_path / "out") if not n.startswith(".weightplan-lock")]
