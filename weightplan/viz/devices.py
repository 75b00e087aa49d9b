"""An automatic placement shown: a per-device table (weights, staging, peak, budget, room
kept, modules) and the device map, folded by layer; and the same as plain data."""

from __future__ import annotations

from typing import Any

from weightplan.planner.tensors.schedule.device_plan import DevicePlacement
from weightplan.units import format_bytes
from weightplan.viz.folding import fold_keys

MAX_NAMES = 8
HEADER = ("device", "weights", "staging", "peak", "budget", "kept", "modules")


def placement_lines(p: DevicePlacement) -> list[str]:
    """The table, the host staging line and the map."""
    rows = [HEADER] + [(u.device + ("" if u.present else " (absent)"), format_bytes(u.weights),
                        format_bytes(u.staging), format_bytes(u.peak),
                        "-" if u.budget is None else format_bytes(u.budget),
                        format_bytes(u.kept) if u.kept else "-", str(u.modules))
                       for u in p.uses]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = [f"devices (device_map={p.strategy!r}; peak = weights + the load's staging there; "
             "kept: room for an offloaded block):"]
    lines += ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
              for r in rows]
    if p.pinned_bytes:
        lines.append(f"  host staging (pinned, for device copies): {format_bytes(p.pinned_bytes)},"
                     " counted in the cpu's staging")
    if p.absent:
        lines.append(f"  dry run: this machine has no {', '.join(p.absent)} (explains, doesn't "
                     "load)")
    if (p.offload_folder or p.offload) and any(d == "disk" for _, d in p.device_map):
        lines += offload_lines(p)
    lines.append("device map:")
    for u in p.uses:
        names = [m or "(the whole model)" for m, d in p.device_map if d == u.device]
        if names:
            folded = fold_keys(names)
            more = f", … {len(folded) - MAX_NAMES} more" if len(folded) > MAX_NAMES else ""
            lines.append(f"  {u.device}: {', '.join(folded[:MAX_NAMES])}{more}")
    return lines


def offload_lines(p: DevicePlacement) -> list[str]:
    """The disk: what stays in the checkpoint (read in place), what is written, per module."""
    off = p.offload
    if off is None:
        return [f"  disk: written to {p.offload_folder} (safetensors), read back by "
                "accelerate's hooks at forward time"]
    lines = [f"  disk: read back by accelerate's hooks at forward time; "
             f"{format_bytes(off.referenced_bytes)} referenced in place in the checkpoint "
             f"(not read by the load), {format_bytes(off.written_bytes)} written to "
             f"{p.offload_folder or '(no offload_folder: nothing to write)'}"]
    modules = off.by_module(m for m, d in p.device_map if d == "disk")
    for module, (ref, wrote, nbytes) in list(modules.items())[:MAX_NAMES]:
        how = [f"{ref} referenced"] if ref else []
        how += [f"{wrote} written ({format_bytes(nbytes)})"] if wrote else []
        lines.append(f"    {module or '(the whole model)'}: {', '.join(how)}")
    if len(modules) > MAX_NAMES:
        lines.append(f"    … {len(modules) - MAX_NAMES} more modules")
    why = sorted({t.why_written for t in off.tensors if not t.referenced})
    if why:
        lines.append(f"    written because converted: {'; '.join(why)}")
    return lines


def offload_dict(p: DevicePlacement) -> dict[str, Any] | None:
    """The disk's tensors as data: per module and per tensor, referenced or written."""
    off = p.offload
    if off is None:
        return None
    modules = off.by_module(m for m, d in p.device_map if d == "disk")
    return {"folder": off.folder, "referenced_bytes": off.referenced_bytes,
            "written_bytes": off.written_bytes,
            "modules": {m: {"referenced": r, "written": w, "bytes_written": b}
                        for m, (r, w, b) in modules.items()},
            "tensors": {t.name: {"referenced": t.referenced, "file": t.file,
                                 "weight_name": t.weight_name, "bytes": t.nbytes,
                                 "why_written": t.why_written or None}
                        for t in off.tensors}}


def placement_dict(p: DevicePlacement) -> dict[str, Any]:
    """The placement as plain data (``plan.to_dict()["devices"]``)."""
    return {"strategy": p.strategy, "offload_folder": p.offload_folder,
            "pinned_staging_bytes": p.pinned_bytes, "absent": list(p.absent),
            "offload": offload_dict(p),
            "table": [{"device": u.device, "weights": u.weights, "staging": u.staging,
                       "peak": u.peak, "budget": u.budget, "kept": u.kept,
                       "modules": u.modules, "present": u.present} for u in p.uses]}
