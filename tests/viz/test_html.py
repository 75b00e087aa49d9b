"""The notebook view: the grouped table, totals, problems, the timeline and the graph."""

import xml.etree.ElementTree as ET

import torch

import weightplan
from weightplan.viz import dot as dot_module
from weightplan.viz.html import plan_html

from tests.viz.plans import small_plan

from tests.conftest import needs_dot


def test_html_repr_has_the_grouped_table():
    html = small_plan()._repr_html_()
    assert "<table>" in html and "<th>checkpoint keys</th>" in html
    assert "<td>model.layers.{0,1}.block_sparse_moe.experts.{0,1}.w1.weight<br>" in html
    assert "model.layers.{0,1}.mlp.experts.gate_up_proj</td>" in html
    assert "convert MergeModulelist(dim=0) → Concatenate(dim=1)" in html
    assert "missing (1): model.lm_head.weight" in html and "peak estimate:" in html


def test_html_has_the_timeline_svg_inline():
    html = plan_html(small_plan(), graph=False)
    start, end = html.index("<svg"), html.index("</svg>") + len("</svg>")
    ET.fromstring(html[start:end])
    assert "<?xml" not in html


def test_html_escapes_keys():
    plan = weightplan.explain(None, {"a<b>&c": torch.ones(1)})
    html = plan_html(plan, graph=False)
    assert "a&lt;b&gt;&amp;c" in html and "a<b>" not in html


def test_html_escapes_control_characters_in_keys():
    """ESC and a line break in a key are shown as their escapes, as the printed plan does:
    not raw in the table (an invalid character, a break HTML collapses) nor in the problems'
    <pre>, where the break forged a line."""
    plan = weightplan.explain(None, {"weird\x1b[31mred\nforged": torch.ones(1)})
    html = plan_html(plan, graph=False)
    assert "\x1b" not in html and "weird\\x1b[31mred\\nforged" in html
    assert not any(line.startswith("forged") for line in html.splitlines())


def test_html_without_dot_says_how_to_get_the_graph(monkeypatch):
    monkeypatch.setattr(dot_module, "find_dot", lambda: None)
    html = small_plan()._repr_html_()
    assert "install graphviz" in html and html.count("<svg") == 1  # the timeline only


@needs_dot
def test_html_includes_the_graph_when_dot_exists():
    html = small_plan()._repr_html_()
    assert html.count("<svg") == 2 and "plan graph (grouped)" in html
