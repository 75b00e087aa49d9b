"""``verify``'s invariants of the reads the executor issues, each read on its own.

For every :class:`~weightplan.planner.tensors.lower.read_tasks.ReadTask` of a step, as the
executor reads it (``entry``, ``byte_range``, ``pieces``, the scale tiles of a
dequantize, the fragment it lands in):

1. its byte range is its region's span of its tensor, and lies inside the tensor's bytes;
2. its byte range lies inside its file's data section (so do the scale tiles a dequantize
   reads, inside the scale's bytes);
3. its pieces split the range back to back, without gaps;
4. a placed read lands the region it reads; a direct one (a plain byte copy) fills a
   contiguous view of exactly its bytes. Where each lands is gathered, a
   :class:`~weightplan.planner.tensors.verify.coverage.Landing` at a time, for the
   coverage check.

What a read's geometry decides (its layout, region, entry spec, scale, view shape and
stride, destination) is the same for the items of a stack: it is judged once for each
run of reads that share it (as objects), and each read's offsets are checked on their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import cast

from weightplan.planner.core.geometry import Fragment, Region, _is_contiguous
from weightplan.planner.core.sharding.fp8_slices import scale_region
from weightplan.planner.inputs.checkpoint import Checkpoint, TensorEntry
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.tensors.verify.coverage import Landing
from weightplan.planner.tensors.ir.nodes import DequantizeAttrs, Node, NodeKind
from weightplan.planner.tensors.lower.placement import Step
from weightplan.planner.tensors.lower.read_tasks import ReadLayout, ReadTask

Sections = dict[str, tuple[int, int]]  # file → (first data byte, file size)
ANYWHERE = (-1 << 62, 1 << 62)  # (an entry in memory, or in a file without a section)
_DEQUANTIZE = NodeKind.DEQUANTIZE
# a READ node's entry (an AttributeError for any other kind: its attrs hold none)
_ENTRY = cast(Callable[[Node], TensorEntry], attrgetter("attrs.entry"))


def sections(checkpoint: Checkpoint | None) -> Sections:
    return {f.path: (f.data_start, f.size) for f in (checkpoint.files if checkpoint else ())}


@dataclass(slots=True)
class _Geometry:
    """What the reads sharing one geometry read: their layout's range within their tensor
    and what it should be (the region's span), the scale window within the scale. (A
    verdict of one verify pass, never changed: not frozen, as a frozen ``__init__`` costs
    twice as much, once per geometry.)"""

    first: int
    length: int
    span: tuple[int, int]  # (first byte, bytes) of the region within the tensor
    inside: bool  # the layout's range lies inside the tensor's bytes
    pieces: str | None  # what is wrong with the pieces
    scale_first: int
    scale_length: int
    scale_inside: bool  # the scale window lies inside the scale's bytes

    @property
    def sound(self) -> bool:
        return self.inside and self.pieces is None and self.span == (self.first, self.length)

    def bounds(self, section: tuple[int, int]) -> tuple[int, int]:
        """The entry offsets whose reads lie in ``section`` (none when the geometry is
        wrong: every read of it is worded)."""
        if not self.sound:
            return 1, 0
        return section[0] - self.first, section[1] - self.first - self.length

    def scale_bounds(self, section: tuple[int, int]) -> tuple[int, int]:
        """The scale offsets whose tiles lie in ``section`` (none when they leave the scale)."""
        if not self.scale_inside:
            return 1, 0
        return section[0] - self.scale_first, section[1] - self.scale_first - self.scale_length


# the verdicts of one verify pass on each geometry (:func:`geometry_key`), made once for
# the reads of every step that share it
Judged = dict[tuple[int, ...], "_Geometry"]


def read_problems(step: Step, where: Sections, judged: Judged
                  ) -> tuple[list[str], list[Landing]]:
    """Every broken read invariant of ``step`` (see the module docstring), in read order,
    and where its reads land (for the coverage check); ``judged``: see :func:`_judged`."""
    problems: list[str] = []
    landed: list[Landing] = []
    layout = region = spec = scale_spec = attrs = None
    geometry, file, scale_file = _NOTHING, cast(object, _NOTHING), cast(object, _NOTHING)
    low = high = scale_low = scale_high = 0  # (where a read's / its scale's first byte may be)
    landing, misplaced = _NOWHERE, cast("str | None", None)
    for task in step.reads:
        node = task.node
        try:
            entry, scale = _read_entries(node)
        except (AttributeError, ValueError):  # (its attrs hold no entry; not two inputs)
            problems.append(_not_a_read(step, node))
            continue
        if task.entry is not entry:  # (the executor reads the task's entry)
            problems.append(f"step {step.label}: a read task of {entry.key} carries the entry "
                            f"of {task.entry.key}; lower the step again")
            continue
        if scale is not None and (scale.spec is not scale_spec or node.attrs is not attrs):
            scale_spec, attrs, layout = scale.spec, node.attrs, None
        if task.layout is not layout or task.region is not region or entry.spec is not spec:
            layout, region, spec = task.layout, task.region, entry.spec
            geometry = _judged(judged, task, entry, scale)
            file, scale_file, landing = _NOTHING, _NOTHING, _NOWHERE
        fragment = task.fragment
        if fragment is not None:
            view = fragment.view
            if view.shape is not landing.shape or view.stride is not landing.stride or \
                    fragment.region is not landing.region or fragment.target != landing.target:
                landing = Landing(fragment.target, fragment.region, view.shape, view.stride)
                landed.append(landing)
                misplaced = landing_problem(task, fragment, step.destinations)
            landing.offsets.append(view.offset)
            if misplaced is not None:
                problems.append(f"read of {entry.key}: {misplaced}")
        if entry.file is not file:
            file = entry.file
            low, high = geometry.bounds(_section(where, file))
        if not low <= entry.offset <= high:
            problems += _range_problems(task, entry, where, geometry)
        if scale is not None:
            if scale.file is not scale_file:
                scale_file = scale.file
                scale_low, scale_high = geometry.scale_bounds(_section(where, scale_file))
            if not scale_low <= scale.offset <= scale_high:
                problems.append(_scale_problem(scale, geometry, where))
    return problems, landed


def _judged(judged: Judged, task: ReadTask, entry: TensorEntry, scale: TensorEntry | None
            ) -> _Geometry:
    """The verdict on ``task``'s geometry, judged once per verify pass (the objects it is
    keyed by, :func:`geometry_key`, are alive as long as the pass: its steps hold them)."""
    key = geometry_key(task, entry, scale)
    found = judged.get(key)
    if found is None:
        found = judged[key] = judge(task, entry, scale)
    return found


def geometry_key(task: ReadTask, entry: TensorEntry, scale: TensorEntry | None
                 ) -> tuple[int, ...]:
    """What :func:`judge` reads of a task, by identity: its layout, region and entry spec;
    a dequantize's attrs, its logical spec and its scale's spec."""
    node = task.node
    if node.kind is not _DEQUANTIZE:
        return id(task.layout), id(task.region), id(entry.spec)
    return (id(task.layout), id(task.region), id(entry.spec), id(node.attrs), id(node.spec),
            id(None if scale is None else scale.spec))


def _read_entries(node: Node) -> tuple[TensorEntry, TensorEntry | None]:
    """The entry a read task reads and a dequantize's scale (a packed weight is read
    whole; its parts are no tiles)."""
    if node.kind is not _DEQUANTIZE:
        return _ENTRY(node), None
    if node.attrs.scheme is not None:  # type: ignore[union-attr]
        return _ENTRY(node.inputs[0]), None
    weight, scale_node = node.inputs
    return _ENTRY(weight), _ENTRY(scale_node)


def packed_weight_box(task: ReadTask) -> Region:
    """The box of a packed dequantize's stored weight its region needs, derived from the
    node and the region (not from the layout it checks)."""
    from weightplan.planner.core.quant.formats import Scheme  # (a packed format's plan only)
    from weightplan.planner.core.quant.packed_slices import packed_cover

    attrs = task.node.attrs
    assert isinstance(attrs, DequantizeAttrs) and isinstance(attrs.scheme, Scheme)
    box = packed_cover(attrs.scheme, tuple(task.node.spec.shape), task.region).parts[0]
    return box if box is not None else Region.full(tuple(task.entry.spec.shape))


def _nowhere() -> Landing:
    return Landing(-1, Region((), ()), (), ())  # (no fragment lands like it)


# (shared by every step: no fragment's region is its own, so nothing is added to it)
_NOWHERE = _nowhere()


def _not_a_read(step: Step, node: Node) -> str:
    return (f"step {step.label} reads {node!r}: a read task lowers a read node, or a "
            "dequantize of two; lower steps from the verified graph only")


def _section(where: Sections, file: str | None) -> tuple[int, int]:
    return where.get(file, ANYWHERE) if file is not None else ANYWHERE


def judge(task: ReadTask, entry: TensorEntry, scale: TensorEntry | None) -> _Geometry:
    """The verdict on a read's geometry (layout, region, entry spec, scale spec, block),
    for every read sharing it."""
    layout, spec = task.layout, entry.spec
    size = spec.dtype.itemsize
    if isinstance(task.node.attrs, DequantizeAttrs) and task.node.attrs.scheme is not None:
        box = packed_weight_box(task)  # (the stored box covering the region: packed_slices)
        first, count = box.element_span(tuple(spec.shape))
    else:
        first, count = task.region.element_span(tuple(spec.shape))
    inside = layout.first >= 0 and layout.first + layout.length <= spec.nbytes
    scale_first, scale_length = _scale_window(task, entry, scale)
    scale_inside = scale is None or (scale_first >= 0
                                     and scale_first + scale_length <= scale.nbytes)
    return _Geometry(layout.first, layout.length, (first * size, count * size), inside,
                     _pieces_problem(layout), scale_first, scale_length, scale_inside)


_NOTHING = _Geometry(0, 0, (0, 0), True, None, 0, 0, True)  # (before the first read)


def _box(region: Region) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in zip(region.starts, region.stops, strict=True)) + "]"


def _pieces_problem(layout: ReadLayout) -> str | None:
    """The pieces read in parallel split ``[0, length)`` back to back (or what is wrong)."""
    pieces, length = layout.pieces, layout.length
    covered = sum(n for _, n in pieces)
    if covered != length:
        return f"its pieces cover {covered} of {length} bytes; split the range without gaps"
    at = 0
    for offset, n in pieces:
        if offset != at:
            return (f"its pieces {list(pieces)} are not back to back from 0; split the range "
                    "without gaps or overlaps")
        at += n
    return None


def landing_problem(task: ReadTask, fragment: Fragment, dests: tuple[Destination, ...]
                     ) -> str | None:
    """A placed read lands the region it reads; a direct one copies exactly the bytes of a
    contiguous view (the executor writes its byte range at the view's first byte)."""
    if fragment.region is not task.region and fragment.region != task.region:
        return (f"it reads the region {_box(task.region)} but lands {_box(fragment.region)}; "
                "land the region read")
    layout = task.layout
    if not layout.direct or not 0 <= fragment.target < len(dests):
        return None  # (a target out of range: the coverage check names it)
    view, dest = fragment.view, dests[fragment.target]
    nbytes = view.numel * dest.spec.dtype.itemsize
    if nbytes != layout.length or not _is_contiguous(view.shape, view.stride):
        return (f"a direct copy of {layout.length} bytes into a view of {nbytes} bytes of "
                f"{dest.key} (shape {list(view.shape)}, stride {list(view.stride)}); a direct "
                "read fills a contiguous view of its own size")
    return None


def _scale_window(task: ReadTask, entry: TensorEntry, scale: TensorEntry | None
                  ) -> tuple[int, int]:
    """The scale bytes a dequantize reads (its covering tiles' span), from the scale's first
    byte: as the executor reads them; ``(0, 0)`` for a plain read."""
    attrs = task.node.attrs
    if scale is None or not isinstance(attrs, DequantizeAttrs):
        return 0, 0
    shape: tuple[int, ...] = tuple(scale.spec.shape)
    tiles = scale_region(tuple(entry.spec.shape), shape, task.region, attrs.block)
    first, count = tiles.element_span(shape)
    size = scale.spec.dtype.itemsize
    return first * size, count * size


def _range_problems(task: ReadTask, entry: TensorEntry, where: Sections, geometry: _Geometry
                    ) -> list[str]:
    """What is wrong with a read's byte range, worded."""
    problems = []
    start, length = entry.offset + geometry.first, geometry.length
    if geometry.span != (geometry.first, geometry.length):
        first, count = geometry.span
        problems.append(f"read of {entry.key} [{start}, {start + length}): not the bytes of its "
                        f"region {_box(task.region)} ([{entry.offset + first}, "
                        f"{entry.offset + first + count})); lower it again")
    if not geometry.inside:
        problems.append(f"read of {entry.key} [{start}, {start + length}) leaves the tensor's "
                        f"bytes [{entry.offset}, {entry.offset + entry.nbytes}); the fragment's "
                        "region must lie inside the tensor")
    section = _section(where, entry.file)
    if section is not ANYWHERE and not (section[0] <= start and start + length <= section[1]):
        problems.append(f"read of {entry.key} [{start}, {start + length}) leaves the data "
                        f"section [{section[0]}, {section[1]}) of {entry.file}; the header's "
                        "offsets are wrong: re-open the checkpoint")
    if geometry.pieces is not None:
        problems.append(f"read of {entry.key}: {geometry.pieces}")
    return problems


def _scale_problem(scale: TensorEntry, geometry: _Geometry, where: Sections) -> str:
    """What is wrong with the scale tiles a dequantize reads."""
    section = _section(where, scale.file)
    start, length = scale.offset + geometry.scale_first, geometry.scale_length
    if not geometry.scale_inside:
        return (f"read of {scale.key} [{start}, {start + length}) leaves the tensor's bytes "
                f"[{scale.offset}, {scale.offset + scale.nbytes}); the scale tiles must lie "
                "inside the scale")
    return (f"read of {scale.key} [{start}, {start + length}) leaves the data section "
            f"[{section[0]}, {section[1]}) of {scale.file}; the header's offsets are wrong: "
            "re-open the checkpoint")
