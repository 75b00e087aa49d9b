"""The plan as a graphviz picture: DOT text (pure, deterministic) and SVG/PNG via ``dot``.

:func:`to_dot` turns the folded :class:`~weightplan.viz.groups.Picture` into DOT text:
reads → ops → casts → assigns left to right, one frame per cluster of repeated layers,
colours by node kind (ops by a CRC of their class name), the peak step outlined in red.
The same plan always gives the same bytes. :func:`render_plan` writes ``.dot`` itself and
calls the ``dot`` binary for ``.svg`` / ``.png`` / ``.pdf``; without the binary it writes
the ``.dot`` file next to the requested path and warns with the command that renders it.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from types import FrameType

from weightplan.errors import RenderError
from weightplan.planner.pipelines.plan import LoadPlanData
from weightplan.planner.core.paused_gc import paused_gc
from weightplan.viz.groups import Cluster, Picture, plan_picture
from weightplan.viz.style import (
    CLUSTER_COLOUR, EDGE_COLOUR, PEAK_COLOUR, PROBLEM_COLOUR, PROBLEM_FILL, dot_string,
    terminal_text, write_picture,
)

DOT_FORMATS = ("dot", "gv")
RENDERED_FORMATS = ("svg", "png", "pdf")
DOT_TIMEOUT_S = 120
INSTALL_HINT = ("install graphviz (apt install graphviz, brew install graphviz or "
                "conda install graphviz)")

_HEADER = (
    "digraph weightplan {",
    '  graph [rankdir=LR, fontname="Helvetica", fontsize=12, labelloc=t, labeljust=l, '
    "nodesep=0.12, ranksep=0.3];",
    '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, '
    'color="#4b5563", penwidth=1];',
    f'  edge [color="{EDGE_COLOUR}", arrowsize=0.6];',
)


@paused_gc
def to_dot(plan: LoadPlanData, *, detail: str | None = None, only: str | None = None,
           fold: bool | None = None) -> str:
    """The plan's graph as DOT text (see :func:`~weightplan.viz.groups.plan_picture`).

    Args:
        plan: a :class:`~weightplan.Plan`.
        detail: ``"grouped"`` (default) folds repeated layers and expert lists;
            ``"full"`` draws every node (the default when ``only`` is given).
        only: a glob over checkpoint and model keys, e.g. ``"model.layers.3.*"``.
        fold: the plain 1:1 copies as one counted box (default: for big plans, without
            ``only``; see :func:`~weightplan.viz.groups.plan_picture`).

    Returns:
        DOT text; equal plans give byte-identical text.

    Example:
        >>> print(to_dot(plan, only="model.layers.0.*"))   # doctest: +SKIP
    """
    return picture_dot(plan_picture(plan, detail=detail, only=only, fold=fold))


def picture_dot(picture: Picture) -> str:
    """DOT text for an already folded :class:`Picture`."""
    lines = list(_HEADER)
    lines.append(f"  label={_label(picture.title, left=True)};")
    edges: list[str] = []
    blocks: list[list[str]] = []
    counter = 0
    for c, cluster in enumerate(picture.clusters):
        body, counter = _cluster_lines(cluster, counter, edges)
        if cluster.title is not None:
            body = [f"  subgraph cluster_{c} {{",
                    f"    label={_label(cluster.title, left=True)}; "
                    f'style="rounded,dashed"; color="{CLUSTER_COLOUR}"; fontsize=11;',
                    *("  " + line for line in body), "  }"]
        blocks.append(body)
    # with rankdir=LR, dot stacks disconnected top-level blocks from the bottom up:
    # emitting them in reverse puts them top to bottom in key order
    for body in reversed(blocks):
        lines += body
    if picture.notes:
        note = _label(("problems", *picture.notes), left=True)
        lines.append(f'  problems [shape=note, fillcolor="{PROBLEM_FILL}", '
                     f'color="{PROBLEM_COLOUR}", label={note}];')
    lines += edges
    lines.append("}")
    return "\n".join(lines) + "\n"


def _cluster_lines(cluster: Cluster, counter: int, edges: list[str]) -> tuple[list[str], int]:
    """Node lines of one cluster; its edges go to ``edges`` (drawn after every node)."""
    lines = []
    for part in cluster.parts:
        ids = [f"n{counter + i}" for i in range(len(part.boxes))]
        counter += len(part.boxes)
        for node_id, box in zip(ids, part.boxes, strict=True):
            attrs = [f"label={_label(box.lines)}",
                     f'fillcolor="{box.fill}"']
            if box.peak or box.problem:
                colour = PEAK_COLOUR if box.peak else PROBLEM_COLOUR
                attrs += [f'color="{colour}"', "penwidth=2.5"]
            lines.append(f"  {node_id} [{', '.join(attrs)}];")
        labels = part.labels or ("",) * len(part.edges)
        edges += [f"  {ids[a]} -> {ids[b]}{_edge_attrs(label)};"
                  for (a, b), label in zip(part.edges, labels, strict=True)]
    return lines, counter


def _edge_attrs(label: str) -> str:
    """An edge's renames as its label (nothing for an edge without)."""
    if not label:
        return ""
    return f' [label={_label(tuple(label.splitlines()))}, fontsize=9, fontcolor="{EDGE_COLOUR}"]'


def _label(lines: tuple[str, ...], *, left: bool = False) -> str:
    """One DOT line per item of ``lines``; a key's own ESC or line break is shown escaped."""
    return dot_string("\n".join(map(terminal_text, lines)), left=left)


def find_dot() -> str | None:
    """Path of graphviz's ``dot`` binary, or ``None`` when it isn't installed."""
    return shutil.which("dot")


def run_dot(text: str, fmt: str) -> bytes:
    """Render DOT ``text`` to ``fmt`` (``svg``, ``png``, ``pdf``) with the ``dot`` binary.

    Raises:
        RenderError: ``dot`` is missing, fails or takes longer than two minutes.
    """
    binary = find_dot()
    if binary is None:
        raise RenderError(f"the graphviz `dot` binary was not found: {INSTALL_HINT}")
    try:
        done = subprocess.run([binary, f"-T{fmt}"], input=text.encode(), capture_output=True,
                              timeout=DOT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        raise RenderError(f"running {binary} -T{fmt} failed: {e}") from e
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip()
        raise RenderError(f"{binary} -T{fmt} exited with {done.returncode}: {message}")
    return done.stdout


def picture_format(path: str | Path) -> str:
    """The format ``path``'s suffix names (``svg``, ``dot``, ...), checked before drawing.

    Raises:
        RenderError: a suffix no picture is drawn as.
    """
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in DOT_FORMATS + RENDERED_FORMATS:
        raise RenderError(f"can't draw a plan to {str(path)!r}: use a .svg, .png, .pdf or "
                          f".dot path")
    return fmt


def render_plan(plan: LoadPlanData, path: str | Path, *, detail: str | None = None,
                only: str | None = None, fold: bool | None = None) -> str:
    """Draw ``plan`` to ``path`` and return the file written (see :meth:`Plan.render`).

    ``.dot`` / ``.gv`` get DOT text; ``.svg`` / ``.png`` / ``.pdf`` are rendered by the
    ``dot`` binary when it is installed; otherwise the DOT text goes to ``path`` with a
    ``.dot`` suffix, a :class:`UserWarning` says how to render it, and that path is returned.

    Raises:
        RenderError: an unknown suffix, ``detail`` or glob, ``dot`` failing, or the file
            can't be written.
    """
    path = Path(path)
    fmt = picture_format(path)
    text = to_dot(plan, detail=detail, only=only, fold=fold)
    if fmt in DOT_FORMATS:
        write_picture(path, text)
        return str(path)
    if find_dot() is None:
        dot_path = path.with_suffix(".dot")
        write_picture(dot_path, text)
        command = shlex.join(["dot", f"-T{fmt}", str(dot_path), "-o", str(path)])
        warnings.warn(terminal_text(f"graphviz `dot` not found, wrote {dot_path}; render it "
                                    f"with `{command}` after you {INSTALL_HINT}"),
                      UserWarning, stacklevel=_caller_level())  # (one line, as the CLI says it)
        return str(dot_path)
    write_picture(path, run_dot(text, fmt))
    return str(path)


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside weightplan (the user's call of
    ``render``, however many wrappers lie between), so the warning names the user's line."""
    package = Path(__file__).resolve().parents[1]
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and Path(frame.f_code.co_filename).resolve().is_relative_to(package):
        frame, level = frame.f_back, level + 1
    return level
