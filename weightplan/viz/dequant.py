"""Where FP8 dequantizes run, shown: on the host, or on the destination device after the
copy (FP8 bytes + scale tiles over the bus instead of bf16), with the bytes on each side.
Shown only when the choice matters (a device destination, or a side forced): a plan that
loads onto the CPU prints and serializes as before."""

from __future__ import annotations

from typing import Any

from weightplan.planner.tensors.schedule.dequant_side import DEVICE, HOST, DequantPlacement
from weightplan.units import format_bytes
from weightplan.viz.folding import fold_keys

MAX_NAMES = 6


def shown(d: DequantPlacement | None) -> bool:
    """A side forced, or a destination on an accelerator (else all runs on the host)."""
    return d is not None and (d.mode != "auto" or d.accelerated) and bool(d.sites)


def dequant_lines(d: DequantPlacement | None) -> list[str]:
    """One line per side: how many, which tensors, the host's FP8 staging, the device's
    bf16 bytes and the bytes copied over the bus."""
    if d is None or not shown(d):
        return []
    lines = [f"dequantize (FP8 → floating; dequantize_on={d.mode!r}: on the destination "
             "device when it is a GPU, else on the host):"]
    for side in (DEVICE, HOST):
        sites = [s for s in d.sites if s.side == side]
        if not sites:
            continue
        devices = ", ".join(sorted({s.device for s in sites}))
        where = f"on the device ({devices})" if side == DEVICE else f"on the host (for {devices})"
        names = fold_keys([s.key for s in sites])
        more = f", … {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else ""
        lines.append(f"  {len(sites)} {where}: host holds FP8 "
                     f"{format_bytes(d.bytes_on(side, 'fp8_bytes'))} + scales "
                     f"{format_bytes(d.bytes_on(side, 'scale_bytes'))}, writes "
                     f"{format_bytes(d.bytes_on(side, 'out_bytes'))} dequantized; "
                     f"host → device {format_bytes(d.bytes_on(side, 'bus_bytes'))}")
        lines.append(f"    {', '.join(names[:MAX_NAMES])}{more}")
    return lines


def dequant_dict(d: DequantPlacement) -> dict[str, Any]:
    """The same as data: totals per side and each tensor's side and device."""
    sides = {side: {"count": d.count(side),
                    **{w: d.bytes_on(side, w) for w in ("fp8_bytes", "scale_bytes", "out_bytes",
                                                        "bus_bytes")}}
             for side in (DEVICE, HOST)}
    return {"mode": d.mode, "sides": sides,
            "tensors": {s.key: {"side": s.side, "device": s.device} for s in d.sites}}
