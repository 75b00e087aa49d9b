"""What the picture says without drawing it box by box: plain 1:1 copies, renames on the
edges, and whether the peak is worth an outline.

- A *plain copy* is a conversion that reads one checkpoint tensor and assigns it to one
  model tensor of the same name, with no rename, op, quantization or shard (a dtype cast
  at most): most of a big model's picture. :func:`fold_plain` folds them all into one
  counted box (on by default from :data:`FOLD_AT` conversions).
- :func:`stream_renames` / :func:`target_renames` are the renames that fired on a source
  stream / a target, written on the edge that leaves the read / enters the assign.
- :func:`trivial_peak`: a peak whose step adds little of its own (its reads and the
  intermediates under 5% of the peak: the model's tensors so far and what is in flight
  make it) is not that step's doing, and no box is outlined for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from weightplan.planner.keys.transforms import LEGACY
from weightplan.planner.tensors.ir.build import Conversion, TargetStatus
from weightplan.planner.tensors.ir.nodes import NodeKind
from weightplan.planner.tensors.schedule.schedule import Schedule
from weightplan.units import format_bytes
from weightplan.viz.boxes import Box
from weightplan.viz.folding import fold_alternations, fold_keys
from weightplan.viz.style import KIND_COLOURS

FOLD_AT = 200  # conversions: from here a picture folds its plain copies by default
PLAIN_KINDS = frozenset({NodeKind.READ, NodeKind.CAST, NodeKind.SINK})
MAX_PLAIN_KEYS = 4


def is_plain(conv: Conversion) -> bool:
    """One tensor read and assigned under its own name, a cast at most (see above)."""
    group = conv.group
    if len(conv.targets) != 1 or group.ops or len(group.entries) != 1:
        return False
    target = conv.targets[0]
    if target.status is not TargetStatus.LOAD or target.key != group.entries[0].key:
        return False
    if stream_renames(conv, 0) or target_renames(conv, 0):
        return False
    return all(n.kind in PLAIN_KINDS for n in conv.nodes)


def fold_plain(convs: Sequence[Conversion]) -> tuple[list[Conversion], list[Conversion]]:
    """``(plain copies, the rest)``, each in ``convs``' order."""
    plain: list[Conversion] = []
    rest: list[Conversion] = []
    for conv in convs:
        (plain if is_plain(conv) else rest).append(conv)
    return plain, rest


def plain_box(plain: Sequence[Conversion], peak_line: str | None) -> Box:
    """One box for every plain copy: how many, their key patterns, dtypes and bytes."""
    keys = fold_keys(c.targets[0].key for c in plain)
    shown = keys[:MAX_PLAIN_KEYS - 1] if len(keys) > MAX_PLAIN_KEYS else keys
    more = [f"… {len(keys) - len(shown)} more key patterns"] if len(shown) < len(keys) else []
    dtypes = sorted({str(c.targets[0].dtype).removeprefix("torch.") for c in plain})
    casts = sum(1 for c in plain if any(n.kind is NodeKind.CAST for n in c.nodes))
    cast = f" ({casts} cast)" if casts else ""
    nbytes = sum(c.targets[0].dest.nbytes for c in plain)
    lines = [f"as is ×{len(plain)}: read → assign under the same name", *shown, *more,
             f"{', '.join(dtypes)}{cast} · {format_bytes(nbytes)} into the model"]
    if peak_line:
        lines.append(peak_line)
    return Box(NodeKind.SINK, tuple(lines), KIND_COLOURS[NodeKind.SINK],
               peak=peak_line is not None)


def _described(transforms: Iterable[Any], into: list[str]) -> None:
    for r in transforms:
        text = ("legacy " if r in LEGACY else "") + fold_alternations(r.describe())
        if text not in into:
            into.append(text)


def stream_renames(conv: Conversion, stream: int) -> list[str]:
    """The renames that fired on source stream ``stream``'s keys, in order."""
    out: list[str] = []
    routes = conv.group.routes
    for route in routes[stream] if stream < len(routes) else ():
        _described(route.fired, out)
    return out


def target_renames(conv: Conversion, index: int) -> list[str]:
    """The renames applied to target ``index``'s name after a conversion."""
    out: list[str] = []
    _described(conv.group.renamed_output(*conv.targets[index].position)[1], out)
    return out


def trivial_peak(schedule: Schedule) -> bool:
    """The peak step adds little of its own (see the module docstring)."""
    peak = schedule.peak
    if peak is None:
        return False
    own = schedule.steps[peak.event.step].read_bytes + peak.intermediate
    return own * 20 <= peak.total
