"""The memory timeline picture: stacked series, budget line, peak and its cause, valid SVG."""

import xml.etree.ElementTree as ET

import pytest

import weightplan
from weightplan.errors import RenderError
from weightplan.planner.tensors.schedule.schedule import Event, EventKind, MemoryPoint
from weightplan.units import format_bytes
from weightplan.viz.timeline import byte_ticks, runs, timeline_svg

from tests.conftest import moe_checkpoint, moe_model, write_checkpoint

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def file_plan(tmp_path):
    directory = write_checkpoint(tmp_path / "ckpt", moe_checkpoint(layers=3), shards=2)
    return lambda **kw: weightplan.explain(moe_model(layers=3), directory, mapping="mixtral", **kw)


def point(i: int, resident: int, in_flight: int = 0, intermediate: int = 0) -> MemoryPoint:
    return MemoryPoint(Event(EventKind.SUBMIT, i), f"k{i}", resident, in_flight, intermediate)


def texts(svg: str) -> list[str]:
    return [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]


def test_equal_points_fold_into_runs():
    folded = runs([point(0, 1), point(1, 5, 2), point(2, 5, 2), point(3, 5, 2), point(4, 5)])
    assert [(r.start, r.stop, r.values) for r in folded] == [
        (0, 1, (1, 0, 0)), (1, 4, (5, 2, 0)), (4, 5, (5, 0, 0))]


def test_byte_ticks_are_round_binary_units():
    top, ticks = byte_ticks(3.3 * 2**20)
    assert top >= 3.3 * 2**20 and len(ticks) in range(3, 8)
    assert [label for _, label in ticks][:3] == ["0 MiB", "1 MiB", "2 MiB"]
    top, ticks = byte_ticks(700)
    assert all(label.endswith(" B") for _, label in ticks) and top >= 700


def test_timeline_shows_series_peak_and_cause(file_plan):
    plan = file_plan()
    svg = timeline_svg(plan)
    root = ET.fromstring(svg)
    series = [p.find(f"{SVG}title").text for p in root.iter(f"{SVG}polygon")]
    assert series[0] == "resident" and "in flight" in series
    peak = plan.schedule.peak
    lines = texts(svg)
    head = next(t for t in lines if t.startswith("peak "))
    when = {"submit": "reading", "finalize": "assembling"}[peak.event.kind.value]
    assert head == (f"peak {format_bytes(peak.total)}: {when} step "
                    f"{peak.event.step + 1}/{len(plan.schedule.steps)}")
    assert peak.label in lines
    assert any(t.startswith("resident ") and "in flight" in t for t in lines)
    assert not any(t.startswith("budget") for t in lines)  # no budget: no line, no legend


def test_budget_line_is_drawn(file_plan):
    plan = file_plan(budget=10 * 2**20)
    lines = texts(timeline_svg(plan))
    assert "budget 10 MiB" in lines and "budget" in lines


def test_timeline_is_deterministic(file_plan):
    assert timeline_svg(file_plan()) == timeline_svg(file_plan())


def test_empty_plan_draws_an_empty_frame():
    plan = weightplan.explain(moe_model(layers=1), {})
    assert "nothing to load" in texts(timeline_svg(plan))


def test_render_timeline(tmp_path, file_plan):
    path = file_plan().render_timeline(tmp_path / "mem.svg")
    assert ET.parse(path).getroot().tag == f"{SVG}svg"
    with pytest.raises(RenderError, match="use a .svg path"):
        file_plan().render_timeline(tmp_path / "mem.png")


def test_the_x_axis_is_bytes_read(file_plan):
    from weightplan.viz.timeline import read_edges

    plan = file_plan()
    lines = texts(timeline_svg(plan))
    assert any(t.startswith("bytes read from the checkpoint") for t in lines)
    assert not any("events" in t for t in lines)
    edges = read_edges(plan)
    assert edges[0] == 0 and edges[-1] == plan.read_bytes
    assert len(edges) == len(plan.schedule.timeline) + 1
    assert all(a <= b for a, b in zip(edges, edges[1:], strict=False))
    ticks = [t for t in lines if t.endswith(" KiB") and t[0].isdigit()]
    assert "0 KiB" in ticks and len(ticks) >= 3  # byte labels along the x axis too


def test_the_subtitle_says_the_threads_the_text_plan_says(file_plan):
    import re

    for threads in (4, 1, 0):
        plan = file_plan(threads=threads)
        said = re.search(r"threads: (.*)$", str(plan), re.M).group(1)
        sub = next(t for t in texts(timeline_svg(plan)) if t.startswith("read-ahead window"))
        assert f"threads {said}, no budget" in sub
