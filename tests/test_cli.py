"""The command line: demo, explain with a registered mapping, JSON, typed errors."""

import json

from weightplan.cli import main

from tests.conftest import moe_checkpoint, write_checkpoint


def test_explain_with_model_type(tmp_path, capsys):
    directory = write_checkpoint(tmp_path / "c", moe_checkpoint(), shards=2)
    assert main(["explain", str(directory), "--model-type", "mixtral"]) == 0
    out = capsys.readouterr().out
    assert "→ model.layers.{0,1}.mlp.experts.gate_up_proj  f32[4, 12, 8] ×2" in out


def test_explain_json(tmp_path, capsys):
    directory = write_checkpoint(tmp_path / "c", moe_checkpoint())
    assert main(["explain", str(directory), "--model-type", "mixtral", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"] is None and data["read_bytes"] > 0


def test_errors_are_reported_not_raised(tmp_path, capsys):
    assert main(["explain", str(tmp_path / "missing.safetensors")]) == 2
    assert "CheckpointError" in capsys.readouterr().err
    assert main(["explain", str(tmp_path), "--model-type", "no_such_family"]) == 2


def test_demo_runs(tmp_path, capsys):
    assert main(["demo", "--dir", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "legacy rename LayerNorm" in out and "equal the original's: True" in out
    assert (tmp_path / "demo" / "model.safetensors.index.json").exists()
