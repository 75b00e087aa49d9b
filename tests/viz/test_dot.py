"""The plan graph: golden DOT, grouping of repeated layers and experts, only=, rendering."""

import os
import re
import shlex
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

import weightplan
from weightplan.errors import RenderError
from weightplan.planner.tensors.ir.nodes import NodeKind
from weightplan.viz import dot as dot_module
from weightplan.viz.dot import render_plan, to_dot
from weightplan.viz.groups import plan_picture
from weightplan.viz.style import KIND_COLOURS, PEAK_COLOUR, dot_string, op_colour

from tests.viz.plans import deep_plan, small_plan

GOLDEN = Path(__file__).parent / "golden" / "small_plan.dot"
UPDATE = os.environ.get("WEIGHTPLAN_UPDATE_GOLDEN") == "1"
from tests.conftest import needs_dot  # noqa: E402


def node_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"\s+n\d+ \[", line)]


def test_golden_dot():
    text = to_dot(small_plan())
    if UPDATE:
        GOLDEN.write_text(text, encoding="utf-8")
    assert text.encode() == GOLDEN.read_bytes(), (
        "DOT output changed; if on purpose, rerun with WEIGHTPLAN_UPDATE_GOLDEN=1")


def test_dot_bytes_do_not_depend_on_hash_seed():
    code = ("import sys; from tests.viz.plans import small_plan; "
            "from weightplan.viz.dot import to_dot; sys.stdout.write(to_dot(small_plan()))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True).stdout
    assert out == to_dot(small_plan()).encode()


def test_sixty_layers_fold_into_one_cluster():
    plan = deep_plan(layers=60, experts=8)
    text = to_dot(plan)
    assert "×60 (layers 0..59)" in text and "read experts 0..7: 8 × f32[2, 2]" in text
    assert len(node_lines(text)) < 30  # 60 × (5 parameters, 24 reads) drawn as 16 boxes
    for kind in ("gate_up_proj", "down_proj", "gate.weight", "LayerNorm.weight"):
        assigns = [line for line in node_lines(text) if kind in line and "assign" in line]
        assert len(assigns) == 1, kind
    assert "model.layers.{0..59}.block_sparse_moe.experts.{0..7}.w1.weight" in text
    assert not re.search(r"experts\.\d+\.", text)  # no single expert is drawn


def test_full_detail_draws_every_node():
    plan = small_plan()
    full = plan_picture(plan, detail="full")
    assert full.boxes == len(plan.graph)
    assert plan_picture(plan).boxes < full.boxes


def test_only_draws_one_layer_in_full():
    text = to_dot(small_plan(), only="model.layers.1.*")
    assert "model.layers.0" not in text and "embed_tokens" not in text
    assert "model.layers.1.block_sparse_moe.experts.0.w1.weight" in text
    assert "model.layers.1.block_sparse_moe.experts.1.w1.weight" in text
    assert 'label="model.layers.1\\l' in text  # one cluster for the layer
    grouped = to_dot(small_plan(), only="model.layers.1.*", detail="grouped")
    assert "experts.{0,1}.w1.weight" in grouped


def test_only_matches_checkpoint_keys_too():
    text = to_dot(small_plan(), only="*.LayerNorm.gamma")
    assert "LayerNorm.weight" in text and "LayerNorm.bias" not in text


def test_bad_arguments_raise_render_errors():
    plan = small_plan()
    with pytest.raises(RenderError, match="matches no checkpoint or model key"):
        to_dot(plan, only="nothing.*")
    with pytest.raises(RenderError, match="detail must be one of"):
        to_dot(plan, detail="some")
    with pytest.raises(RenderError, match="use a .svg, .png, .pdf or .dot path"):
        plan.render("plan.jpeg")


def test_peak_and_problems_are_marked():
    text = to_dot(small_plan())
    # the small plan's peak is its model tensors as the last one lands: no box is its cause
    assert not [line for line in node_lines(text) if "▲ peak" in line or PEAK_COLOUR in line]
    assert "peak 528 B at step 12/12: model tensors 528 B + in flight 0 B" in text
    assert "mismatch: the model has f32[3]" in text
    assert "missing (1): model.lm_head.weight" in text
    assert "unexpected (1): model.stray.bias" in text


def test_colours_are_stable_by_kind_and_op_name():
    assert op_colour("MergeModulelist") == op_colour("MergeModulelist") == "#ede9fe"
    assert op_colour("Chunk") == "#e0f2fe"
    text = to_dot(small_plan())
    for line in node_lines(text):
        if "\\nread " in line:
            assert f'fillcolor="{KIND_COLOURS[NodeKind.READ]}"' in line


def test_labels_are_escaped():
    assert dot_string('a"b\\N') == '"a\\"b\\\\N"'
    assert dot_string("one\ntwo", left=True) == '"one\\ltwo\\l"'
    plan = weightplan.explain(None, {'odd"key\\N.w': torch.ones(2)})
    text = to_dot(plan)
    assert 'odd\\"key\\\\N.w' in text


def test_casts_are_drawn():
    text = to_dot(deep_plan(layers=2, experts=2, dtype=torch.bfloat16))
    assert "cast → bf16" in text and f'fillcolor="{KIND_COLOURS[NodeKind.CAST]}"' in text


def test_render_writes_dot(tmp_path):
    path = small_plan().render(tmp_path / "plan.dot")
    assert path == str(tmp_path / "plan.dot")
    assert Path(path).read_text(encoding="utf-8") == GOLDEN.read_text(encoding="utf-8")


def test_render_without_dot_writes_dot_and_says_how(tmp_path, monkeypatch):
    monkeypatch.setattr(dot_module, "find_dot", lambda: None)
    with pytest.warns(UserWarning, match=r"dot -Tsvg .*plan\.dot -o .*plan\.svg"):
        path = small_plan().render(tmp_path / "plan.svg")
    assert path == str(tmp_path / "plan.dot") and Path(path).read_text().startswith("digraph")
    assert not (tmp_path / "plan.svg").exists()


def test_render_without_dot_command_quotes_odd_names_and_warns_at_the_caller(tmp_path,
                                                                                monkeypatch):
    monkeypatch.setattr(dot_module, "find_dot", lambda: None)
    plan = small_plan()
    with pytest.warns(UserWarning) as caught:
        path = plan.render(tmp_path / "my plan; rm x.svg")
    message = str(caught[0].message)
    command = message.split("`")[3]
    assert shlex.split(command) == ["dot", "-Tsvg", path, "-o",
                                    str(tmp_path / "my plan; rm x.svg")]
    assert caught[0].filename == __file__, caught[0].filename


@needs_dot
def test_render_svg_parses_as_xml(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = render_plan(deep_plan(layers=60, experts=8), tmp_path / "plan.svg")
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    assert "×60 (layers 0..59)" in Path(path).read_text(encoding="utf-8")


@needs_dot
def test_render_png_and_only(tmp_path):
    path = small_plan().render(tmp_path / "layer.png", only="model.layers.0.*")
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_dot
def test_dot_failure_is_a_render_error(tmp_path):
    with pytest.raises(RenderError, match="exited with"):
        dot_module.run_dot("digraph { this is not dot", "svg")


def test_control_characters_in_keys_and_names_are_escaped(tmp_path):
    """A checkpoint key or directory name holding ESC or a line break can't forge a line of
    the picture nor make the SVG invalid XML: shown as its escape, as the printed plan does."""
    from safetensors.torch import save_file

    from tests.conftest import moe_checkpoint, moe_model

    ckpt = moe_checkpoint(layers=1)
    ckpt["weird\x1b[31mred\nforged"] = torch.zeros(3)
    directory = tmp_path / "ck\x1bpt"
    directory.mkdir()
    save_file(ckpt, str(directory / "model.safetensors"))
    plan = weightplan.explain(moe_model(layers=1), str(directory), mapping="mixtral")
    text = to_dot(plan)
    assert "\x1b" not in text and "forged" in text
    assert "weird\\\\x1b[31mred\\\\nforged" in text  # DOT's doubled backslash: shows \x1b, \n
    assert not any(line.startswith("forged") for line in text.splitlines())
    timeline = Path(plan.render_timeline(str(tmp_path / "mem.svg"))).read_text(encoding="utf-8")
    assert "\x1b" not in timeline and ET.fromstring(timeline).tag.endswith("svg")
    assert "ck\\x1bpt" in timeline


@pytest.mark.parametrize("draw, suffix", [("render", ".dot"), ("render_timeline", ".svg")])
def test_a_picture_that_cant_be_written_is_a_render_error_naming_it(tmp_path, draw, suffix):
    """Not UnexpectedError's 'please report it': a typed error naming the path and why."""
    plan = small_plan()
    directory = tmp_path / f"adir{suffix}"
    directory.mkdir()
    for target in (tmp_path / "no such dir" / f"plan{suffix}", directory):
        with pytest.raises(RenderError, match=re.escape(f"can't write {target}: ")):
            getattr(plan, draw)(str(target))


def test_every_problem_kind_appears_in_the_picture():
    """A plan execute() refuses for a lossy cast (not a missing, unexpected or mismatched key)
    was drawn with no problem at all: its note now names the kind and the keys, as
    print(plan) does."""
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.zeros(2, 2))
    model.i = torch.nn.Parameter(torch.zeros(2, dtype=torch.int32), requires_grad=False)
    plan = weightplan.explain(model, {"w": torch.ones(2, 2, dtype=torch.complex64),
                                      "i": torch.ones(2)})
    assert {p.kind.value for p in plan.problems} == {"lossy cast"}
    text = to_dot(plan)
    assert "problems [shape=note" in text and "lossy cast (2): i, w" in text
    assert "lossy cast (1): w" in to_dot(plan, only="w")
