"""The explanation as text: a grouped table, totals, the peak estimate, every problem.

Keys, paths and messages come from strangers' files: every line goes through
:func:`~weightplan.viz.style.terminal_text`, so no control or bidi character reaches the
terminal (a key can't forge a line of the verdict); ordinary text is unchanged."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable, Iterable, Sequence
import sys
from typing import TYPE_CHECKING, TypeGuard, cast

from weightplan.planner.core.quant.blocks import FP8_DTYPES
from weightplan.planner.tensors.ir.nodes import NodeKind
from weightplan.planner.core.problems import Note, Problem, ProblemKind
from weightplan.planner.pipelines.plan import Direction, LoadPlanData, PlanData
from weightplan.planner.core.paused_gc import paused_gc
from weightplan.planner.tensors.schedule.budget import machine_fit
from weightplan.planner.tensors.lower.placement import Step
from weightplan.units import counted, format_bytes
from weightplan.viz.adapter_text import adapter_lines
from weightplan.viz.rows import Row
from weightplan.viz.folding import fold_keys
from weightplan.viz.rows import disk_status, mapping_rows
from weightplan.viz.sharing import sharing_lines
from weightplan.viz.strided import strided_lines
from weightplan.viz.style import terminal_text

if TYPE_CHECKING:  # (a load's text imports none of the write side)
    from weightplan.planner.pipelines.write_plan import WritePlanData

MAX_LIST = 12


def _rule_text(row: Row) -> str:
    """The row's rule with its op chain (an FP8 dequantize shows on renamed keys too)."""
    if not row.ops:
        return row.rule
    if "convert" in row.rule:
        return row.rule.replace("convert", f"convert {row.ops}", 1)
    return row.ops if row.rule == "as is" else f"{row.rule}; {row.ops}"


SIZES = " " * 10  # a row's sizes on their own line, under its key
MIN_WIDTH = 40  # narrower than this, a key and its sizes don't fit on a line anyway


@paused_gc
def explain_text(plan: PlanData, width: int | None = None,
                 wording: Callable[[str], str] = str) -> str:
    """Render ``plan`` as the text ``print(plan)`` shows: lines wrapped at ``width`` (or the
    terminal's); printed to a file or a pipe without ``width``, long lines stay whole (one
    line per fact, for grep) and rows choose their layout for 120 columns. ``wording``
    rewrites the advice of the problems (the command line's flags)."""
    wrap = width is not None or sys.stdout.isatty()
    if width is None:
        width = shutil.get_terminal_size((120, 24)).columns if sys.stdout.isatty() else 120
    width = max(width, MIN_WIDTH)
    lines = header_lines(plan) + adapter_lines(plan) + [""]
    lines += mapping_lines(plan, width, fit=wrap) + [""]
    lines += total_lines(plan) + parallel_lines(plan) + [*map(wording, problem_lines(plan))]
    lines += [*map(wording, note_lines(plan))]
    out: Iterable[str] = map(terminal_text, lines)
    if wrap:
        out = (part for line in out for part in wrapped(line, width))
    return "\n".join(out) + "\n"


def wrapped(line: str, width: int) -> list[str]:
    """``line`` cut at spaces into lines of at most ``width`` (a key longer than that stays
    whole), continuation lines indented four past the line's own indent."""
    if len(line) <= width:
        return [line]
    indent = " " * (len(line) - len(line.lstrip(" ")) + 4)
    return textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [line]


def _loaded_bytes(plan: LoadPlanData) -> int:
    """Bytes the model holds once loaded: what the plan writes plus the missing tensors
    (in the dtype asked for), not the model's pre-cast sizes."""
    dtype = plan.options.dtype
    fresh = 0
    for name in plan.missing | plan.findings.ignored_missing:
        t = plan.model_info.get(name) if plan.model_info is not None else None
        if t is None:
            continue
        cast = dtype is not None and t.on_meta and t.spec.dtype.is_floating_point \
            and not t.keep_dtype
        fresh += t.spec.numel * (dtype.itemsize if cast and dtype is not None
                                 else t.spec.dtype.itemsize)
    return plan.model_bytes + fresh + _disk_bytes(plan)[0]


def _disk_bytes(plan: LoadPlanData) -> tuple[int, int]:
    """Of the model's bytes, (those the disk holds in the checkpoint's own files, all
    those offloaded to the disk)."""
    placement = plan.options.placement
    off = placement.offload if placement is not None else None
    return (0, 0) if off is None else (off.referenced_bytes,
                                       off.referenced_bytes + off.written_bytes)


def _disk_text(plan: LoadPlanData) -> str:
    on_disk = _disk_bytes(plan)[1]
    return f", {format_bytes(on_disk)} of it offloaded to the disk" if on_disk else ""


def _dtype_text(plan: PlanData) -> str:
    dtype = plan.options.dtype
    return "" if dtype is None else f" in {str(dtype).removeprefix('torch.')}"


def quantized_text(plan: LoadPlanData) -> str:
    """What the plan does with FP8 weights: kept with their scales (the model holds FP8),
    dequantized into the model's dtype, or quantized; ``""`` when there are none."""
    dequantized: dict[str, int] = {}
    quantized = 0
    for conv in plan.conversions:
        for node in conv.nodes if conv.loads else ():
            if node.kind is NodeKind.DEQUANTIZE:
                scheme = getattr(node.attrs, "scheme", None)  # a packed format's
                fmt = "FP8" if scheme is None else scheme.describe().split(" (")[0]
                name = f"{fmt} dequantized to {str(node.spec.dtype).removeprefix('torch.')}"
                dequantized[name] = dequantized.get(name, 0) + 1
            elif node.kind is NodeKind.QUANTIZE and not getattr(node.attrs, "scale", False):
                quantized += 1
    held: dict[str, int] = {}
    for step in plan.schedule.steps:
        for d in step.destinations:
            if d.written and d.spec.dtype in FP8_DTYPES:
                name = str(d.spec.dtype).removeprefix("torch.")
                held[name] = held.get(name, 0) + 1
    kept = sum(held.values()) - quantized
    packed = [n.message for n in plan.findings.notes if n.key == "<kept quantized>"]
    parts = [f"FP8 kept ({kept} tensors in {'/'.join(held)}, with their scales)"] \
        if kept > 0 and not packed else []  # (a packed format's F8 parts: said below)
    parts += [f"{what} ({counted(n, 'checkpoint weight')})" for what, n in dequantized.items()]
    parts += packed
    if quantized:
        parts.append(f"quantized to FP8 ({quantized} tensors)")
    return "; ".join(parts)


def header_lines(plan: PlanData) -> list[str]:
    if not isinstance(plan, LoadPlanData):
        return write_header_lines(cast("WritePlanData", plan))
    ckpt = plan.checkpoint
    files = f"{counted(len(ckpt.files), 'file')}, " if ckpt.files else ""
    quantized = "" if plan.model_info is None else quantized_text(plan)
    model = "no model" if plan.model_info is None else (
        f"{plan.model_info.class_name} ({counted(len(plan.model_info.unique()), 'tensor')}, "
        f"{format_bytes(_loaded_bytes(plan))}{_dtype_text(plan)}{_disk_text(plan)}"
        f"{'; ' + quantized if quantized else ''})")
    extra = len(plan.transforms) - len(plan.mapping.transforms)
    mapping = plan.mapping.key or "none"
    reason = plan.mapping.reason.removesuffix(" (plus legacy renames)")  # counted next
    lines = [f"weightplan plan: {ckpt.description} ({files}{counted(len(ckpt), 'tensor')}, "
             f"{format_bytes(ckpt.nbytes)}) → {model}",
             f"mapping: {mapping} — {reason} (+{extra} legacy renames)"]
    subs = plan.mapping.submodules  # which submodule got which mapping (SPEC §5)
    if len(subs) > 1 or any(s.path for s in subs):
        lines += [f"  {s.describe()}" for s in subs]
    return lines


def write_header_lines(plan: WritePlanData) -> list[str]:
    layout = plan.layout
    what = f"{plan.direction.value} ({plan.inversion.description})"
    return [f"weightplan {what}: {plan.checkpoint.description} "
            f"({counted(len(plan.checkpoint), 'tensor')}) → {plan.directory} "
            f"({counted(len(layout.files), 'file')}{' + index' if layout.index else ''}, "
            f"{counted(len(layout.locations), 'tensor')}, "
            f"{format_bytes(layout.total_bytes)})",
            f"mapping: {plan.mapping.key or 'none'} — {plan.mapping.reason}"]


def mapping_lines(plan: PlanData, width: int, fit: bool = False) -> list[str]:
    """One block per folded row: rule, checkpoint keys, then ``→ model key`` and sizes
    (``fit``: the sizes on a line of their own where the key and they pass ``width``)."""
    lines, previous, n = [], None, 0
    for row in mapping_rows(plan.conversions, disk_status(plan)):
        rule = _rule_text(row)
        one_to_one = len(row.sources) == 1 and len(row.targets) == 1
        if rule != previous or (row.ops and not one_to_one):  # consecutive rows of one rule
            n += 1  # share a header, unless they gather or split keys (their own block each)
            lines.append(f"#{n:<3} {rule}")
        previous = rule if one_to_one or not row.ops else None
        count = f" ×{row.tensors}" if row.tensors > 1 else ""
        writes = plan.direction is not Direction.LOAD
        status = row.status.replace("load", "write") if writes else row.status
        info = f"{row.dtype}{row.shape}{count}  {format_bytes(row.nbytes)}  {status}"
        targets = list(row.targets)
        if len(row.sources) == 1 and len(targets) == 1:
            one = f"      {row.sources[0]} → {targets[0]}"
            if row.sources[0] == targets[0]:
                one = f"      {targets[0]}"
            if len(one) + len(info) + 2 <= width:
                lines.append(f"{one}  {info}")
                continue
            if fit and row.sources[0] == targets[0]:  # as is: the key once, sizes under it
                lines += [one, f"{SIZES}{info}"]
                continue
        lines += [f"      {src}" for src in row.sources]
        lines += [f"    → {t}" for t in targets[:-1]]
        last = f"    → {targets[-1]}"
        fits = not fit or len(last) + len(info) + 2 <= width
        lines += [f"{last}  {info}"] if fits else [last, f"{SIZES}{info}"]
    return lines


def total_lines(plan: PlanData) -> list[str]:
    steps = plan.schedule.steps
    read = plan.read_bytes
    direct = sum(map(direct_bytes, steps))
    peak = plan.schedule.peak
    at = f" at step {peak.event.step + 1}/{len(steps)} ({peak.label})" if peak else ""
    threads = threads_text(plan)
    reads = counted(sum(len(p.reads) for p in steps), "read")
    lines = [
        f"reads: {format_bytes(read)} in {reads}, "
        f"{100 * direct / read if read else 100:.0f}% straight into {_sink_text(plan)}; "
        f"{'model tensors' if _into_model(plan) else 'tensors'} written: "
        f"{format_bytes(plan.model_bytes)}",
        f"peak estimate: {format_bytes(plan.peak_bytes)}{at}; read-ahead window "
        f"{format_bytes(plan.schedule.window_bytes)}, threads: {threads}"
        + (f", budget {format_bytes(plan.options.budget)}" if plan.options.budget else ""),
    ]
    lines += strided_lines(steps) + sharing_lines(plan)
    staged = plan.atomic_bytes if isinstance(plan, LoadPlanData) else 0
    if staged:  # allocated model tensors are written in place
        lines.append(f"in place: {format_bytes(staged)} of allocated model tensors; "
                     f"execute(atomic=True) stages them (+{format_bytes(staged)}) so a "
                     "failure touches nothing")
    # loads land in this machine's memory (saves don't); a device map's table judges each
    # device against its own budget instead
    if isinstance(plan, LoadPlanData) and plan.options.placement is None:
        lines.append(machine_fit(plan.schedule, plan.model_bytes).describe())
    return lines + device_lines(plan)


def threads_text(plan: PlanData) -> str:
    """The reading threads asked for, and how many run when that is fewer (one per CPU)."""
    threads = plan.options.threads
    if not threads:
        return "inline"
    if plan.schedule.threads != threads:
        return f"{threads} ({plan.schedule.threads} used: one per CPU)"
    return str(threads)


def _into_model(plan: PlanData) -> TypeGuard[LoadPlanData]:
    """A load into a model (not into the fresh tensors a plan without a model hands back)."""
    return isinstance(plan, LoadPlanData) and plan.model is not None


def _sink_text(plan: PlanData) -> str:
    if plan.direction is not Direction.LOAD:
        return "the output files"
    if not _into_model(plan):
        return "the returned tensors"
    referenced, offloaded = _disk_bytes(plan)
    return "model memory or offload files" if offloaded > referenced else "model memory"


def direct_bytes(step: Step) -> int:
    """Bytes of ``step``'s reads that are plain copies."""
    return sum(r.layout.length for r in step.reads if r.layout.direct)


def device_lines(plan: PlanData) -> list[str]:
    """With ``device=``: bytes per device, and the host staging CUDA copies go through."""
    sided: list[str] = []
    if plan.options.dequantize is not None:  # (FP8 only)
        from weightplan.viz.dequant import dequant_lines

        sided = dequant_lines(plan.options.dequantize)
    if plan.options.placement is not None:
        from weightplan.viz.devices import placement_lines  # (device_map="auto" & co.)

        return placement_lines(plan.options.placement) + sided
    devices = plan.options.devices
    if devices is None:
        return sided
    per: dict[str, int] = {}
    for program in plan.schedule.steps:
        for dest in program.destinations:
            if dest.allocates:
                name = str(devices.device_for(dest.key))
                per[name] = per.get(name, 0) + dest.spec.nbytes
    text = ", ".join(f"{d} {format_bytes(n)}" for d, n in sorted(per.items()))
    staging = ""
    if devices.uses_cuda:
        from weightplan.planner.tensors.schedule.device_plan import staging_of  # (CUDA only)

        pool = staging_of(plan.schedule.steps, devices).nbytes
        staging = f"; host staging (pinned) ≤ {format_bytes(pool)}" if pool else ""
    return [f"devices: {text or 'nothing allocated'}{staging}"] + sided


def parallel_lines(plan: PlanData) -> list[str]:
    """Tensor parallel: this rank's bytes read, held, replicated, and what is read whole."""
    if not isinstance(plan, LoadPlanData) or plan.sharding is None:
        return []
    s, steps = plan.sharding, plan.schedule.steps
    needed = sum(p.needed_bytes for p in steps)
    share = plan.checkpoint.nbytes / s.world_size
    mode = "dry run" if s.mesh is None else f"output {s.output}"
    lines = [f"tensor parallel: rank {s.rank} of {s.world_size} ({s.plan.source}; {mode}): "
             f"reads {format_bytes(needed)} ({needed / share if share else 0:.2f} × 1/"
             f"{s.world_size} of the checkpoint), holds {format_bytes(plan.held_bytes)} "
             f"({format_bytes(plan.replicated_bytes)} replicated), peak "
             f"{format_bytes(plan.peak_bytes)}"]
    whole = [p.label for p in steps if p.materialize and any(
        d.shard is not None and d.shard.placement.is_sharded for d in p.destinations)]
    if whole:
        lines.append(f"  read whole, then sliced (an op can't take a slice): "
                     f"{', '.join(fold_keys(whole)[:MAX_LIST])}")
    return lines


def problem_lines(plan: PlanData) -> list[str]:
    if not isinstance(plan, LoadPlanData) or not plan.problems:
        return ["problems: none"]
    lines = [f"problems: {len(plan.problems)}"]
    simple = {ProblemKind.MISSING: plan.missing, ProblemKind.UNEXPECTED: plan.unexpected}
    for kind, names in simple.items():
        if names:
            folded = fold_keys(names)
            lines.append(f"  {kind.value} ({len(names)}): " + ", ".join(folded[:MAX_LIST])
                         + (f", … {len(folded) - MAX_LIST} more" if len(folded) > MAX_LIST else ""))
    lines += _mismatch_lines(plan)
    detailed = _folded([p for p in plan.problems if p.kind not in simple
                        and p.kind is not ProblemKind.MISMATCH])
    for label, message in detailed[:MAX_LIST]:
        lines.append(f"  {label}: {message}")
    if len(detailed) > MAX_LIST:
        lines.append(f"  … {len(detailed) - MAX_LIST} more")
    return lines


def _mismatch_lines(plan: LoadPlanData) -> list[str]:
    """Shape mismatches folded by layer: one line per (checkpoint shape, model shape)."""
    by_shapes: dict[tuple, list[str]] = {}
    for key, mismatch in plan.mismatched.items():
        by_shapes.setdefault(tuple(mismatch), []).append(key)
    lines = []
    for (got, want), keys in by_shapes.items():
        folded = fold_keys(keys)
        lines.append(f"  mismatch ({len(keys)}): {', '.join(folded[:3])}"
                     f"{', …' if len(folded) > 3 else ''}: checkpoint gives {list(got)} but the "
                     f"model has {list(want)}")
    return lines


def _folded(items: Sequence[Problem | Note]) -> list[tuple[str, str]]:
    """Problems or notes whose messages differ only in their key, folded by layer."""
    groups: dict[tuple[str, str], list[str]] = {}
    for item in items:
        kind = getattr(getattr(item, "kind", None), "value", "")
        template = item.message.replace(item.key, "\0") if item.key else item.message
        if item.key and template == item.message and isinstance(item, Problem):
            template = f"\0: {item.message}"  # a message that doesn't name its key
        groups.setdefault((kind, template), []).append(item.key)
    out = []
    for (kind, template), keys in groups.items():
        folded = fold_keys(keys) if len(keys) > 1 else keys
        text = ", ".join(folded[:3]) + (", …" if len(folded) > 3 else "")
        out.append((kind, template.replace("\0", text)))
    return out


def note_lines(plan: PlanData) -> list[str]:
    notes: tuple[Note, ...] = getattr(plan, "notes", ())  # (both directions' plans have them)
    # the mapping lookup's note says what the header's mapping line says already
    notes = tuple(n for n in notes if n.key or n.message != plan.mapping.reason)
    if not notes:
        return []
    lines = [f"notes: {len(notes)}"]
    folded = _folded(notes)
    lines += [f"  {message}" for _, message in folded[:MAX_LIST]]
    if len(folded) > MAX_LIST:
        lines.append(f"  … {len(folded) - MAX_LIST} more")
    return lines
