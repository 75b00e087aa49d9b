"""The memory timeline as an SVG picture, written by hand (no plotting library).

One stacked step area per event of the schedule: model tensors resident so far, reads in
flight, intermediates of ops run on tensors (the terms of ``planner.schedule``'s memory
model), the budget as a dashed line when one is set, and the peak marked and labelled
with its cause: which step, and how its bytes split. The x axis is the bytes read from
the checkpoint so far (each step's reads widen it by their bytes; a plan that reads
nothing is drawn over its events). The output is plain text, deterministic for a given
plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from weightplan.errors import RenderError
from weightplan.planner.pipelines.plan import LoadPlanData
from weightplan.planner.tensors.schedule.schedule import EventKind, MemoryPoint
from weightplan.units import format_bytes
from weightplan.viz.style import (
    PEAK_COLOUR, SERIES_COLOURS, checkpoint_name, write_picture, xml_text,
)

WIDTH, HEIGHT = 960, 400
LEFT, RIGHT, TOP, BOTTOM = 88, 24, 78, 52
FONT = 'font-family="Helvetica, Arial, sans-serif"'
_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024), ("B", 1))


@dataclass(frozen=True)
class Run:
    """Consecutive events ``[start, stop)`` with the same planned bytes."""

    start: int
    stop: int
    values: tuple[int, int, int]  # resident, in flight, intermediate


@dataclass(frozen=True)
class Frame:
    """Maps (event index, bytes) to picture coordinates."""

    events: int
    top_bytes: float
    width: int
    height: int
    edges: tuple[float, ...] = ()  # where each event starts on the x axis, and the end

    @property
    def span(self) -> float:
        """The x axis' length: bytes read in all (events, without reads)."""
        return self.edges[-1] if self.edges else float(self.events)

    def x(self, event: float) -> float:
        """Horizontal position of the start of event number ``event`` (between two
        events' starts for a fraction)."""
        if not self.edges:
            return self.at(event)
        whole = min(int(event), len(self.edges) - 1)
        ahead = self.edges[min(whole + 1, len(self.edges) - 1)] - self.edges[whole]
        return self.at(self.edges[whole] + (event - whole) * ahead)

    def at(self, position: float) -> float:
        """Horizontal position of ``position`` on the x axis (bytes read, or events)."""
        return LEFT + (self.width - LEFT - RIGHT) * position / max(self.span, 1)

    def y(self, nbytes: float) -> float:
        """Vertical position of ``nbytes`` (0 at the axis, ``top_bytes`` at the top)."""
        return self.height - BOTTOM - (self.height - TOP - BOTTOM) * nbytes / self.top_bytes


def read_edges(plan: LoadPlanData) -> tuple[float, ...]:
    """Bytes read before each event of the timeline, then in all: a step's submit reads
    its bytes, its finalize none; ``()`` when the plan reads nothing."""
    steps = plan.schedule.steps
    edges, done = [0.0], 0.0
    for point in plan.schedule.timeline:
        if point.event.kind is EventKind.SUBMIT:
            done += steps[point.event.step].read_bytes
        edges.append(done)
    return tuple(edges) if done else ()


def runs(timeline: Sequence[MemoryPoint]) -> list[Run]:
    """Fold consecutive equal points: a long finalize tail is one run, not thousands."""
    out: list[Run] = []
    for i, p in enumerate(timeline):
        values = (p.resident, p.in_flight, p.intermediate)
        if out and out[-1].values == values:
            out[-1] = Run(out[-1].start, i + 1, values)
        else:
            out.append(Run(i, i + 1, values))
    return out


def byte_ticks(top: float) -> tuple[float, list[tuple[float, str]]]:
    """A round axis top ≥ ``top`` and 3-6 tick positions labelled in binary units."""
    name, unit = next(((n, u) for n, u in _UNITS if top >= u), ("B", 1))
    value = max(top / unit, 1e-9)
    raw = value / 4
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    if unit == 1:
        step = max(step, 1)
    count = math.ceil(value / step - 1e-9)
    ticks = [(k * step * unit, f"{round(k * step, 6):g} {name}") for k in range(count + 1)]
    return count * step * unit, ticks


def timeline_svg(plan: LoadPlanData, *, width: int = WIDTH, height: int = HEIGHT) -> str:
    """The plan's memory timeline as an SVG document (see the module docstring).

    Args:
        plan: a :class:`~weightplan.Plan`.
        width, height: picture size in pixels.

    Returns:
        SVG text; equal plans give identical text.
    """
    timeline = plan.schedule.timeline
    budget = plan.options.budget
    top, ticks = byte_ticks(max(plan.peak_bytes, budget or 0, 1) * 1.12)
    frame = Frame(len(timeline), top, width, height, read_edges(plan))
    body = _titles(plan, width) + _axes(frame, ticks)
    if timeline:
        body += _areas(frame, runs(timeline)) + _budget(frame, budget)
        body += _peak(frame, plan)
    else:
        body.append(_text(width / 2, height / 2, "nothing to load", anchor="middle"))
    body += _legend(budget is not None)
    return "\n".join(_document(width, height, plan) + body + ["</svg>"]) + "\n"


def render_timeline(plan: LoadPlanData, path: str | Path) -> str:
    """Write :func:`timeline_svg` to ``path`` (a ``.svg`` file); returns the path written.

    Raises:
        RenderError: another suffix, or the file can't be written.
    """
    path = timeline_path(path)
    write_picture(path, timeline_svg(plan))
    return str(path)


def timeline_path(path: str | Path) -> Path:
    """``path``, checked before drawing: the timeline is SVG.

    Raises:
        RenderError: another suffix.
    """
    path = Path(path)
    if path.suffix.lower() != ".svg":
        raise RenderError(f"the memory timeline is drawn as SVG: use a .svg path, "
                          f"not {str(path)!r}")
    return path


def _document(width: int, height: int, plan: LoadPlanData) -> list[str]:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" {FONT} font-size="12">',
            f"<title>weightplan memory timeline: {xml_text(checkpoint_name(plan.checkpoint))}"
            "</title>",
            f'<rect width="{width}" height="{height}" fill="#ffffff"/>']


def _titles(plan: LoadPlanData, width: int) -> list[str]:
    from weightplan.viz.text import threads_text

    sched = plan.schedule
    head = (f"planned memory as the checkpoint is read: {format_bytes(plan.read_bytes)} in "
            f"{len(sched.steps)} steps, peak {format_bytes(plan.peak_bytes)}")
    budget = plan.options.budget
    sub = (f"read-ahead window {format_bytes(sched.window_bytes)}, threads {threads_text(plan)}"
           + (f", budget {format_bytes(budget)}" if budget is not None else ", no budget"))
    return [_text(LEFT, 24, head, size=15, weight="bold"), _text(LEFT, 44, sub, fill="#4b5563")]


def _axes(frame: Frame, ticks: list[tuple[float, str]]) -> list[str]:
    out = []
    x0, x1 = frame.x(0), frame.x(frame.events)
    for value, label in ticks:
        y = frame.y(value)
        out.append(f'<line x1="{x0:.1f}" y1="{y:.1f}" x2="{x1:.1f}" y2="{y:.1f}" '
                   f'stroke="#e5e7eb"/>')
        out.append(_text(x0 - 8, y + 4, label, anchor="end", fill="#374151"))
    base = frame.y(0)
    out.append(f'<line x1="{x0:.1f}" y1="{base:.1f}" x2="{x1:.1f}" y2="{base:.1f}" '
               f'stroke="#374151"/>')
    for position, label in _x_ticks(frame):
        x = frame.at(position)
        out.append(f'<line x1="{x:.1f}" y1="{base:.1f}" x2="{x:.1f}" y2="{base + 5:.1f}" '
                   f'stroke="#374151"/>')
        out.append(_text(x, base + 18, label, anchor="middle", fill="#374151"))
    what = ("bytes read from the checkpoint (each step: its reads, then its tensors assembled)"
            if frame.edges else "events in execution order (nothing is read)")
    out.append(_text((x0 + x1) / 2, frame.height - 10, what, anchor="middle", fill="#374151"))
    return out


def _x_ticks(frame: Frame) -> list[tuple[float, str]]:
    """Round byte positions along a bytes-read axis (at most its end), else event numbers."""
    if not frame.edges:
        return [(float(k), str(k)) for k in _event_ticks(frame.events)]
    _, ticks = byte_ticks(frame.span)
    return [(value, label) for value, label in ticks if value <= frame.span]


def _event_ticks(events: int) -> list[int]:
    if events <= 0:
        return [0]
    step = max(1, math.ceil(events / 8))
    return list(range(0, events, step)) + [events]


def _areas(frame: Frame, folded: list[Run]) -> list[str]:
    """Three stacked step areas: resident at the bottom, then in flight, intermediate."""
    out = []
    for k, (name, colour) in enumerate(SERIES_COLOURS.items()):
        lower = [sum(r.values[:k]) for r in folded]
        upper = [lo + r.values[k] for lo, r in zip(lower, folded, strict=True)]
        if upper == lower:
            continue
        top = [(frame.x(x), frame.y(v)) for r, v in zip(folded, upper, strict=True)
               for x in (r.start, r.stop)]
        bottom = [(frame.x(x), frame.y(v)) for r, v in zip(reversed(folded), reversed(lower), strict=True)
                  for x in (r.stop, r.start)]
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in top + bottom)
        out.append(f'<polygon points="{points}" fill="{colour}" fill-opacity="0.85" '
                   f'stroke="{colour}" stroke-width="0.5"><title>{name}</title></polygon>')
    return out


def _budget(frame: Frame, budget: int | None) -> list[str]:
    if budget is None:
        return []
    y, x1 = frame.y(budget), frame.x(frame.events)
    return [f'<line x1="{frame.x(0):.1f}" y1="{y:.1f}" x2="{x1:.1f}" y2="{y:.1f}" '
            f'stroke="{PEAK_COLOUR}" stroke-width="1.5" stroke-dasharray="6,4"/>',
            _text(x1 - 4, y - 5, f"budget {format_bytes(budget)}", anchor="end",
                  fill=PEAK_COLOUR, halo=True)]


def _peak(frame: Frame, plan: LoadPlanData) -> list[str]:
    """Mark the peak event and say what it is: the step, the event, how the bytes split."""
    timeline, peak = plan.schedule.timeline, plan.schedule.peak
    if peak is None:
        return []
    index = timeline.index(peak)
    x, y = frame.x(index + 0.5), frame.y(peak.total)
    when = "reading" if peak.event.kind is EventKind.SUBMIT else "assembling"
    lines = [f"peak {format_bytes(peak.total)}: {when} step "
             f"{peak.event.step + 1}/{len(plan.schedule.steps)}",
             peak.label,
             f"resident {format_bytes(peak.resident)} + in flight "
             f"{format_bytes(peak.in_flight)} + intermediate {format_bytes(peak.intermediate)}"]
    right = x > frame.width / 2
    tx = x - 8 if right else x + 8
    anchor = "end" if right else "start"
    out = [f'<line x1="{x:.1f}" y1="{frame.y(0):.1f}" x2="{x:.1f}" y2="{y:.1f}" '
           f'stroke="{PEAK_COLOUR}" stroke-dasharray="2,2"/>',
           f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{PEAK_COLOUR}"/>']
    ty = max(y + 16, TOP + 14)
    box_w = 6.6 * max(map(len, lines)) + 12  # roughly: 12px Helvetica is ~6.6px a char
    box_x = tx - box_w + 6 if right else tx - 6
    out.append(f'<rect x="{box_x:.1f}" y="{ty - 13:.1f}" width="{box_w:.1f}" height="50" '
               f'rx="3" fill="#ffffff" fill-opacity="0.85"/>')
    out += [_text(tx, ty + 15 * i, line, anchor=anchor, fill=PEAK_COLOUR, halo=True,
                  weight="bold" if i == 0 else None) for i, line in enumerate(lines)]
    return out


def _legend(budget: bool) -> list[str]:
    out, x = [], LEFT
    for name, colour in SERIES_COLOURS.items():
        out.append(f'<rect x="{x}" y="56" width="12" height="12" fill="{colour}"/>')
        out.append(_text(x + 17, 66, name))
        x += 40 + 7 * len(name)
    if budget:
        out.append(f'<line x1="{x}" y1="62" x2="{x + 22}" y2="62" stroke="{PEAK_COLOUR}" '
                   f'stroke-width="1.5" stroke-dasharray="6,4"/>')
        out.append(_text(x + 28, 66, "budget"))
    return out


def _text(x: float, y: float, text: str, *, anchor: str = "start", size: int | None = None,
          fill: str | None = None, weight: str | None = None, halo: bool = False) -> str:
    """One ``<text>``; ``halo`` draws a white outline under it to keep it readable on areas."""
    attrs = [f'x="{x:.1f}"', f'y="{y:.1f}"']
    if anchor != "start":
        attrs.append(f'text-anchor="{anchor}"')
    if size:
        attrs.append(f'font-size="{size}"')
    if fill:
        attrs.append(f'fill="{fill}"')
    if weight:
        attrs.append(f'font-weight="{weight}"')
    if halo:
        attrs.append('stroke="#ffffff" stroke-width="3" paint-order="stroke"')
    return f"<text {' '.join(attrs)}>{xml_text(text)}</text>"
