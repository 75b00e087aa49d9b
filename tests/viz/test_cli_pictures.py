"""``weightplan explain … --svg plan.svg --timeline mem.svg``."""

import json
import xml.etree.ElementTree as ET

import pytest

from weightplan.cli import main
from weightplan.viz import dot as dot_module

from tests.conftest import needs_dot, moe_checkpoint, write_checkpoint


@pytest.fixture
def ckpt_dir(tmp_path):
    return write_checkpoint(tmp_path / "c", moe_checkpoint(), shards=2)


def test_explain_writes_graph_and_timeline(ckpt_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(dot_module, "find_dot", lambda: None)
    args = ["explain", str(ckpt_dir), "--model-type", "mixtral", "--json",
            "--svg", str(tmp_path / "plan.svg"), "--timeline", str(tmp_path / "mem.svg")]
    assert main(args) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays pure JSON; messages go to stderr
    assert "dot -Tsvg" in captured.err and f"wrote {tmp_path / 'plan.dot'}" in captured.err
    assert (tmp_path / "plan.dot").read_text().startswith("digraph")
    ET.parse(tmp_path / "mem.svg")


def test_explain_only_and_detail(ckpt_dir, tmp_path, capsys):
    out = tmp_path / "layer.dot"
    assert main(["explain", str(ckpt_dir), "--model-type", "mixtral", "--svg", str(out),
                 "--only", "model.layers.1.*"]) == 0
    text = out.read_text()
    assert "model.layers.1.block_sparse_moe.experts.3.w2.weight" in text
    assert "model.layers.0" not in text


def test_bad_glob_is_an_error_not_a_traceback(ckpt_dir, tmp_path, capsys):
    assert main(["explain", str(ckpt_dir), "--model-type", "mixtral",
                 "--svg", str(tmp_path / "x.dot"), "--only", "nope.*"]) == 5
    assert "RenderError" in capsys.readouterr().err


@needs_dot
def test_explain_svg_with_dot(ckpt_dir, tmp_path, capsys):
    assert main(["explain", str(ckpt_dir), "--model-type", "mixtral",
                 "--svg", str(tmp_path / "plan.svg")]) == 0
    assert ET.parse(tmp_path / "plan.svg").getroot().tag.endswith("svg")


def test_fold_and_no_fold(ckpt_dir, tmp_path, capsys):
    """``--fold`` folds the plain copies of even a small plan; ``--no-fold`` draws them."""
    for flag, folded in (("--fold", True), ("--no-fold", False)):
        out = tmp_path / f"{flag}.dot"
        assert main(["explain", str(ckpt_dir), "--model-type", "mixtral", "--svg", str(out),
                     flag]) == 0
        text = out.read_text()
        assert ("as is ×" in text) is folded
        assert "model.embed_tokens.weight" in text


def test_picture_messages_are_one_line_each_whatever_the_file_names(ckpt_dir, tmp_path, capsys,
                                                                      monkeypatch):
    """A line break in --svg / --timeline's name can't forge a line of stderr."""
    monkeypatch.setattr(dot_module, "find_dot", lambda: None)
    args = ["explain", str(ckpt_dir), "--model-type", "mixtral",
            "--svg", str(tmp_path / "p\nforged.svg"), "--timeline", str(tmp_path / "t\nforged.svg")]
    assert main(args) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("weightplan: ") for line in err), err
    assert "p\\nforged.dot" in err[0] and "t\\nforged.svg" in err[2]
