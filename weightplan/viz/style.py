"""Shared look of the pictures: stable colours, byte labels, escaping for DOT, XML and
terminals.

Colours never depend on run order or ``hash()`` randomization: node kinds have fixed
colours and ops take theirs from a CRC of the op's class name, so the same plan draws
the same picture on every machine.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from xml.sax.saxutils import escape as _xml_escape

from weightplan.errors import RenderError
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.terminal import terminal_lines, terminal_text  # noqa: F401 (re-exported)
from weightplan.planner.tensors.ir.nodes import NodeKind

KIND_COLOURS = {
    NodeKind.READ: "#dbeafe",  # light blue: bytes come from the checkpoint
    NodeKind.CAST: "#fef3c7",  # light amber: a dtype change
    NodeKind.DEQUANTIZE: "#fde68a",  # amber: quantized bytes widened
    NodeKind.QUANTIZE: "#fed7aa",  # orange: narrowed to a quantized dtype
    NodeKind.SHARD: "#e9d5ff",  # violet: one rank's part
    NodeKind.SINK: "#dcfce7",  # light green: lands in the model (or the output files)
}
OP_PALETTE = ("#ede9fe", "#fce7f3", "#e0f2fe", "#fae8ff", "#ffedd5", "#ccfbf1", "#f5f5f4",
              "#e0e7ff")
PEAK_COLOUR = "#dc2626"
PROBLEM_COLOUR = "#b91c1c"
PROBLEM_FILL = "#fee2e2"  # mismatched assigns and the problems note
EDGE_COLOUR = "#6b7280"
CLUSTER_COLOUR = "#9ca3af"

# memory timeline series: resident model tensors, reads in flight, op intermediates
SERIES_COLOURS = {"resident": "#60a5fa", "in flight": "#f59e0b", "intermediate": "#a78bfa"}


def op_colour(name: str) -> str:
    """A stable pastel colour for an op class name (CRC32, not the salted ``hash()``)."""
    return OP_PALETTE[zlib.crc32(name.encode()) % len(OP_PALETTE)]


def dot_string(text: str, *, left: bool = False) -> str:
    """``text`` as a double-quoted DOT string, one DOT line break per line of ``text``.

    Backslashes are doubled first: DOT reads ``\\N``, ``\\G``, ``\\L`` … as escapes.
    ``left=True`` left-justifies every line (DOT's ``\\l``) instead of centring them.
    """
    body = text.replace("\\", "\\\\").replace('"', '\\"')
    lines = body.splitlines() or [""]
    if left:
        return '"' + "".join(line + "\\l" for line in lines) + '"'
    return '"' + "\\n".join(lines) + '"'


def write_picture(path: Path, data: str | bytes) -> None:
    """Write a drawing to ``path``.

    Raises:
        RenderError: the file can't be written (no such directory, a directory, no
            permission), naming it and why.
    """
    try:
        if isinstance(data, str):
            path.write_text(data, encoding="utf-8")
        else:
            path.write_bytes(data)
    except OSError as e:
        raise RenderError(f"can't write {terminal_text(str(path))}: "
                          f"{e.strerror or type(e).__name__}") from e


def xml_text(text: str) -> str:
    """Escape ``text`` for XML character data and double-quoted attributes; control
    characters (which XML can't hold) are written as their escapes, as on a terminal."""
    return _xml_escape(terminal_text(text), {'"': "&quot;"})


def checkpoint_name(checkpoint: Checkpoint) -> str:
    """The checkpoint's last path component: pictures don't depend on where it lies."""
    return Path(checkpoint.description).name or checkpoint.description
