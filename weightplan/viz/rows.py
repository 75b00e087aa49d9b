"""The grouped mapping: conversions with the same shape of work folded into one row."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import attrgetter, indexOf

from weightplan.planner.tensors.ir.build import Conversion, TargetStatus
from weightplan.planner.tensors.ir.nodes import DequantizeAttrs, Node, NodeKind, QuantizeAttrs
from weightplan.planner.core.spec import short_dtype
from weightplan.planner.keys.transforms import LEGACY
from weightplan.planner.pipelines.plan import LoadPlanData, PlanData
from weightplan.viz.folding import fold_alternations, fold_keys, split_numbers

_KIND, _KEY = attrgetter("kind"), attrgetter("key")


@dataclass(frozen=True)
class Row:
    """One line of the explanation: ``count`` conversions that differ only in indices."""

    rule: str
    sources: tuple[str, ...]  # folded checkpoint keys
    targets: tuple[str, ...]  # folded model keys
    ops: str
    shape: str
    dtype: str
    status: str
    count: int  # conversions folded into the row
    tensors: int  # the tensors its target keys name (what ``×N`` beside the shape counts)
    nbytes: int  # bytes assigned to model tensors (all folded conversions; a mismatch's
    # are what it would assign, as its graph node says: execute refuses it)


def rule_of(conv: Conversion) -> str:
    fired = []
    for stream in conv.group.routes:
        for route in stream:
            for r in route.fired:
                text = ("legacy " if r in LEGACY else "") + fold_alternations(r.describe())
                if text not in fired:
                    fired.append(text)
    for t in conv.targets:
        for r in conv.group.renamed_output(*t.position)[1]:
            if fold_alternations(r.describe()) not in fired:
                fired.append(fold_alternations(r.describe()))
    notes = {r.note for stream in conv.group.routes for r in stream if r.note}
    parts = fired + (["convert"] if conv.group.ops else [])
    parts += sorted(notes)
    return "; ".join(parts) if parts else "as is"


def _status(conv: Conversion, disk: Mapping[str, str]) -> str:
    """What happens to the conversion's targets; a loaded one the device map puts on the
    disk says so (``disk``: model key → how, from the plan's offload)."""
    statuses = sorted({disk.get(t.key, "load") if t.status is TargetStatus.LOAD
                       else t.status.value for t in conv.targets})
    return "+".join(statuses)


def disk_status(plan: PlanData) -> dict[str, str]:
    """The model keys a load offloads (every alias) → ``"disk: referenced"`` (read back
    from the checkpoint's own file) or ``"disk: written"`` (to ``offload_folder``)."""
    placement = plan.options.placement if isinstance(plan, LoadPlanData) else None
    off = placement.offload if placement is not None else None
    if off is None:
        return {}
    return {alias: "disk: referenced" if t.referenced else "disk: written"
            for t in off.tensors for alias in t.aliases or (t.name,)}


def _dtype(conv: Conversion) -> str:
    kinds = []
    for t in conv.targets:
        text = short_dtype(t.produced.dtype)
        if t.dtype != t.produced.dtype:
            text += f"→{short_dtype(t.dtype)}"
        if text not in kinds:
            kinds.append(text)
    return ",".join(kinds)


def _shapes(conv: Conversion) -> str:
    shapes = []
    for t in conv.targets:
        text = "[" + ", ".join(map(str, t.produced.shape)) + "]"
        if text not in shapes:
            shapes.append(text)
    return " ".join(shapes)


def _ops(conv: Conversion) -> str:
    """The op chain as the mapping wrote it (resolved sizes are an implementation detail)."""
    written = conv.group.ops
    chain = [repr(o) for o in written]
    dequantize = _last_of(conv.nodes, NodeKind.DEQUANTIZE)
    if dequantize is not None:
        chain.insert(0, quant_label(dequantize) + " (per source, with its scale)")
    if conv.quantizes:
        quantize = _last(conv, lambda n: n.kind is NodeKind.QUANTIZE
                         and isinstance(n.attrs, QuantizeAttrs) and not n.attrs.scale)
        if quantize is not None:
            chain.append(quant_label(quantize) + " + scale")
    return " → ".join(chain)


def quant_label(node: Node) -> str:
    """``dequantize 128×128 → bf16`` / ``dequantize INT4 group 32 → bf16`` / ``quantize
    128×128 → f8_e4m3`` / ``… → scale f32``."""
    a = node.attrs
    assert isinstance(a, (DequantizeAttrs, QuantizeAttrs)), node
    block = "×".join(map(str, a.block))
    if isinstance(a, DequantizeAttrs):
        what = _scheme_words(a.scheme) if a.scheme is not None else block
        return f"dequantize {what} → {short_dtype(a.dtype)}"
    what = "scale " if a.scale else ""
    return f"quantize {block} → {what}{short_dtype(a.dtype)}"


def _scheme_words(scheme: object) -> str:
    """A packed format in a few words: ``MXFP4``, ``NVFP4``, ``INT4 group 32``, ``FP8 per
    channel`` (the notes give the whole description)."""
    fmt = getattr(scheme, "format", "")
    if fmt in ("mxfp4", "nvfp4"):
        return fmt.upper()
    name = "FP8" if fmt == "fp8" else f"INT{getattr(scheme, 'bits', '')}"
    strategy, group, block = (getattr(scheme, k, None) for k in ("strategy", "group", "block"))
    how = {"tensor": "per tensor", "channel": "per channel", "group": f"group {group}",
           "block": "block " + "×".join(map(str, block or ()))}.get(str(strategy), "")
    return f"{name} {how}".strip()


def _last_of(nodes: tuple[Node, ...], kind: NodeKind) -> Node | None:
    """The last node of ``kind``, looked for from the end in one C-level pass (a stack's
    last dequantize is a few nodes from it)."""
    try:
        return nodes[-1 - indexOf(map(_KIND, reversed(nodes)), kind)]
    except ValueError:  # (none)
        return None


_ASSIGNED = (TargetStatus.LOAD, TargetStatus.MISMATCH)  # (the others aren't read: 0 B)


def _last(conv: Conversion, wanted: Callable[[Node], bool]) -> Node | None:
    return next((n for n in reversed(conv.nodes) if wanted(n)), None)


def _signature(conv: Conversion, disk: Mapping[str, str]) -> tuple:
    templates = tuple(split_numbers(t.key)[0] for t in conv.targets)
    return (rule_of(conv), templates, _ops(conv),
            tuple(t.produced.shape for t in conv.targets), _dtype(conv), _status(conv, disk))


def mapping_rows(conversions: tuple[Conversion, ...],
                 disk: Mapping[str, str] | None = None) -> list[Row]:
    """Fold conversions whose keys differ only in numeric components (and in what happens
    to them: ``disk``, the model keys offloaded, see :func:`disk_status`)."""
    buckets: dict[tuple, list[Conversion]] = {}
    for conv in conversions:
        buckets.setdefault(_signature(conv, disk or {}), []).append(conv)
    rows = []
    for signature, convs in buckets.items():
        first = convs[0]
        sources = fold_keys(*([*map(_KEY, s)] for c in convs for s in c.group.sources))
        targets = fold_keys(t.key for c in convs for t in c.targets)
        nbytes = sum(t.dest.nbytes for c in convs for t in c.targets if t.status in _ASSIGNED)
        rows.append(Row(signature[0], tuple(sources), tuple(targets),
                        _ops(first), _shapes(first),
                        signature[4], signature[5], len(convs),
                        sum(len(c.targets) for c in convs), nbytes))
    return rows
