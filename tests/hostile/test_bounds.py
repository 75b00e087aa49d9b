"""Issue 21 item 12: hostile configs can't ask for unbounded work.

``num_hidden_layers: 1e9`` made ``weightplan explain DIR`` build meta layers forever,
``--tp 1000000`` planned a million ranks, a 512 MiB ``generation_config.json`` was read
whole. Each is refused before the work (child processes with a time limit, so the old
behaviour fails the test instead of hanging it), with a typed error that says the limit
and how to raise it; raising it lets the work through.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import weightplan
from weightplan.errors import ModelBuildError, ParallelError

from .helpers import REPO

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama")
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
    weightplan.save(model, directory, progress=False)
    return directory


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "weightplan.cli", *args],
                              capture_output=True, text=True, timeout=90,
                              env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})))
    except subprocess.TimeoutExpired:
        pytest.fail(f"weightplan {' '.join(args)} did not end within 90 s")


def _with_config(llama_dir, tmp_path, **changes):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    config = json.loads((llama_dir / "config.json").read_text())
    for key, value in changes.items():
        if "." in key:  # nested: text_config.num_hidden_layers
            outer, inner = key.split(".")
            config.setdefault(outer, {})[inner] = value
        else:
            config[key] = value
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "model.safetensors").symlink_to(llama_dir / "model.safetensors")
    return directory


@pytest.mark.parametrize("field, value", [("num_hidden_layers", 1e9),
                                          ("num_hidden_layers", 10**9),
                                          ("text_config.num_hidden_layers", 10**9),
                                          ("num_local_experts", 10**9)])
def test_a_config_asking_for_unbounded_layers_is_refused(llama_dir, tmp_path, field, value):
    result = _cli("explain", str(_with_config(llama_dir, tmp_path, **{field: value})))
    assert result.returncode == 5, result.stderr
    assert "ModelBuildError" in result.stderr and field in result.stderr
    limit = "WEIGHTPLAN_MAX_EXPERTS" if "experts" in field else "WEIGHTPLAN_MAX_LAYERS"
    assert limit in result.stderr


def test_the_layer_limit_can_be_raised(llama_dir, tmp_path, monkeypatch):
    from weightplan.bridge.hub import build_empty_model

    directory = _with_config(llama_dir, tmp_path, num_hidden_layers=1100)
    with pytest.raises(ModelBuildError, match="WEIGHTPLAN_MAX_LAYERS"):
        build_empty_model(directory)
    monkeypatch.setenv("WEIGHTPLAN_MAX_LAYERS", "2000")
    assert len(build_empty_model(directory).model.model.layers) == 1100


def test_a_million_ranks_are_refused(llama_dir):
    result = _cli("explain", str(llama_dir), "--tp", "1000000")
    assert result.returncode == 5, result.stderr
    assert "ParallelError" in result.stderr and "WEIGHTPLAN_MAX_RANKS" in result.stderr


def test_the_rank_limit_can_be_raised(llama_dir, monkeypatch):
    from weightplan.bridge.hub import build_empty_model
    from weightplan.planner.pipelines.ranks import plan_ranks

    model = build_empty_model(llama_dir).model
    tp = weightplan.TensorParallel(world_size=2, rank=0, output="local")
    monkeypatch.setenv("WEIGHTPLAN_MAX_RANKS", "1")
    with pytest.raises(ParallelError, match="the limit is 1 ranks"):
        plan_ranks(model, llama_dir, tp)
    monkeypatch.setenv("WEIGHTPLAN_MAX_RANKS", "2")
    assert len(plan_ranks(model, llama_dir, tp)) == 2


@pytest.mark.parametrize("kind", ["huge", "fifo"])
def test_a_huge_or_special_generation_config_is_not_read(llama_dir, tmp_path, kind):
    directory = _with_config(llama_dir, tmp_path)
    path = directory / "generation_config.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as f:
            f.truncate(512 * 1024 * 1024)  # sparse: no disk used
    code = ("import weightplan, sys\ntry:\n    weightplan.from_pretrained(sys.argv[1])\n"
            "except weightplan.WeightplanError as e:\n    print(type(e).__name__, e)\n")
    try:
        result = subprocess.run([sys.executable, "-c", code, str(directory)], timeout=90,
                                capture_output=True, text=True,
                                env=dict(os.environ, PYTHONPATH=str(REPO)))
    except subprocess.TimeoutExpired:
        pytest.fail("from_pretrained blocked on generation_config.json")
    assert result.stdout.startswith("ModelBuildError"), result.stdout + result.stderr
    expected = "WEIGHTPLAN_MAX_CONFIG_BYTES" if kind == "huge" else "FIFO"
    assert expected in result.stdout and "generation_config.json" in result.stdout
