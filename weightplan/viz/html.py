"""``Plan._repr_html_``: the plan in a notebook, as a table and pictures.

The grouped mapping table (the rows of ``print(plan)``), the totals and problems, the
memory timeline (always: it is drawn by hand) and the grouped graph when graphviz's
``dot`` binary is installed. Every piece of text is HTML-escaped, its control characters
written as their escapes first (as the printed plan shows them: ``terminal_text``).
"""

from __future__ import annotations

from html import escape as _html_escape

from weightplan.errors import RenderError
from weightplan.planner.pipelines.plan import LoadPlanData
from weightplan.units import format_bytes
from weightplan.viz.rows import Row, disk_status, mapping_rows
from weightplan.viz.style import terminal_text
from weightplan.viz.text import header_lines, note_lines, problem_lines, total_lines

_COLUMNS = ("#", "checkpoint keys", "model keys", "rule and ops", "dtype", "shape", "×",
            "bytes", "status")
_STYLE = ("<style>.weightplan table{border-collapse:collapse;font-size:12px}"
          ".weightplan th,.weightplan td{border:1px solid #d1d5db;padding:2px 6px;"
          "text-align:left;vertical-align:top;font-family:monospace}"
          ".weightplan th{background:#f3f4f6}.weightplan summary{cursor:pointer}</style>")


def plan_html(plan: LoadPlanData, *, graph: bool = True) -> str:
    """The plan as an HTML fragment for Jupyter (see the module docstring).

    Args:
        plan: a :class:`~weightplan.Plan`.
        graph: include the grouped graph as inline SVG when ``dot`` is installed.
    """
    from weightplan.viz.timeline import timeline_svg

    parts = [_STYLE, '<div class="weightplan">',
             _pre(header_lines(plan)), rows_table(mapping_rows(plan.conversions, disk_status(plan))),
             _pre(total_lines(plan) + problem_lines(plan) + note_lines(plan))]
    if graph:
        svg = graph_svg(plan)
        parts.append(_details("plan graph (grouped)", _inline(svg)) if svg is not None else
                     "<p>install graphviz (its <code>dot</code> binary) to see the plan "
                     "graph here</p>")
    parts += [_details(f"memory timeline (peak {format_bytes(plan.peak_bytes)})",
                       _inline(timeline_svg(plan))), "</div>"]
    return "\n".join(parts)


def rows_table(rows: list[Row]) -> str:
    """The grouped mapping as an HTML ``<table>``."""
    head = "".join(f"<th>{escape(c)}</th>" for c in _COLUMNS)
    body = []
    for n, row in enumerate(rows, 1):
        rule = row.rule.replace("convert", f"convert {row.ops}", 1) if row.ops else row.rule
        cells = (str(n), "<br>".join(map(escape, row.sources)),
                 "<br>".join(map(escape, row.targets)), escape(rule), escape(row.dtype),
                 escape(row.shape), str(row.tensors), escape(format_bytes(row.nbytes)),
                 escape(row.status))
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def graph_svg(plan: LoadPlanData) -> str | None:
    """The grouped graph as SVG text, or ``None`` when ``dot`` is missing or fails."""
    from weightplan.viz.dot import find_dot, run_dot, to_dot

    if find_dot() is None:
        return None
    try:
        return run_dot(to_dot(plan), "svg").decode("utf-8", errors="replace")
    except RenderError:
        return None


def _inline(svg: str) -> str:
    """Drop the XML prolog and doctype: inline SVG starts at ``<svg``."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else ""


def escape(text: str) -> str:
    """``text`` for HTML: control characters as their escapes, then ``&<>"'`` escaped."""
    return _html_escape(terminal_text(text))


def _pre(lines: list[str]) -> str:
    return "<pre>" + "\n".join(map(escape, lines)) + "</pre>"


def _details(summary: str, content: str) -> str:
    return f"<details open><summary>{escape(summary)}</summary>{content}</details>"
