"""Deliverable 1: nothing weightplan does runs code shipped in a checkpoint directory."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from safetensors.torch import save_file

import weightplan
from weightplan.errors import ModelBuildError, UnsafeFormatError

from .helpers import run_cli

pytest.importorskip("transformers")

PAYLOAD = """
import pathlib
pathlib.Path({marker!r}).write_text("the shipped code ran")
from transformers import PretrainedConfig
class EvilConfig(PretrainedConfig):
    model_type = "evil"
"""


def _evil_dir(tmp_path, model_type: str):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    marker = tmp_path / "marker"
    (ckpt / "configuration_evil.py").write_text(PAYLOAD.format(marker=str(marker)))
    (ckpt / "modeling_evil.py").write_text(PAYLOAD.format(marker=str(marker)))
    config = {"model_type": model_type, "architectures": ["EvilModel"],
              "auto_map": {"AutoConfig": "configuration_evil.EvilConfig",
                           "AutoModel": "modeling_evil.EvilModel"}}
    (ckpt / "config.json").write_text(json.dumps(config))
    save_file({"w": torch.zeros(2)}, str(ckpt / "model.safetensors"))
    return ckpt, marker


def test_cli_explain_never_runs_shipped_config_code(tmp_path):
    """End to end, in a subprocess answering "y" to any prompt."""
    ckpt, marker = _evil_dir(tmp_path, "evil")
    result = run_cli("explain", str(ckpt), stdin="y\ny\ny\n")
    assert not marker.exists(), "code from the checkpoint directory ran"
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "auto_map" in result.stderr and "never runs code" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("model_type", ["evil", "llama"])
def test_cli_main_never_runs_shipped_code(tmp_path, model_type, monkeypatch, capsys):
    """In process (faster), "y" on stdin, for an unknown and a known model_type: the
    unknown one is refused; the known one is built from transformers' own classes, its
    auto_map ignored, as transformers does without trust_remote_code (the plan then finds
    the checkpoint's one tensor unexpected)."""
    import io

    from weightplan import cli

    ckpt, marker = _evil_dir(tmp_path, model_type)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\ny\ny\n"))
    assert cli.main(["explain", str(ckpt)]) == (5 if model_type == "evil" else 1)
    assert not marker.exists(), "code from the checkpoint directory ran"
    captured = capsys.readouterr()
    if model_type == "evil":
        assert "never runs code" in captured.err
    else:
        assert "LlamaForCausalLM" in captured.out and "never runs code" not in captured.err


def test_build_empty_model_refuses_auto_map(tmp_path):
    from weightplan.bridge.hub import build_empty_model

    ckpt, marker = _evil_dir(tmp_path, "evil")
    with pytest.raises(ModelBuildError, match="auto_map"):
        build_empty_model(ckpt)
    assert not marker.exists()


def test_config_read_with_remote_code_disabled(tmp_path, monkeypatch):
    """Even without auto_map, no remote code: a config naming its model_type is made by
    transformers' own class for it from the dict weightplan read (AutoConfig isn't asked);
    one naming none goes to AutoConfig, told not to trust remote code."""
    import transformers

    from weightplan.bridge.hub import build_empty_model

    seen = {}

    def fake(path, **kwargs):
        seen.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", fake)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    built = build_empty_model(tmp_path)
    assert not seen and type(built.model.config) is transformers.LlamaConfig
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ModelBuildError, match="stop here"):
        build_empty_model(tmp_path)
    assert seen.get("trust_remote_code") is False


class _Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickles_are_never_unpickled(tmp_path):
    marker = tmp_path / "marker"
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "pytorch_model.bin").write_bytes(pickle.dumps(_Boom(str(marker))))
    with pytest.raises(UnsafeFormatError):
        weightplan.explain(None, ckpt)
    with pytest.raises(UnsafeFormatError):
        weightplan.explain(None, ckpt / "pytorch_model.bin")
    assert not marker.exists()
