"""``plan.to_dict()``: the explanation as plain, JSON-serializable data."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from weightplan.planner.keys.registry import SubmoduleMapping
from weightplan.planner.pipelines.plan import LoadPlanData
from weightplan.planner.pipelines.write_plan import WritePlanData

from weightplan.planner.core.paused_gc import paused_gc
from weightplan.planner.tensors.schedule.budget import machine_fit
from weightplan.viz.devices import placement_dict
from weightplan.viz.adapter_text import adapter_dict
from weightplan.viz.rows import disk_status, mapping_rows
from weightplan.viz.text import quantized_text


@paused_gc
def plan_to_dict(plan: LoadPlanData) -> dict[str, Any]:
    info = plan.model_info
    data = {
        "checkpoint": {"description": plan.checkpoint.description,
                       "files": [f.path for f in plan.checkpoint.files],
                       "tensors": len(plan.checkpoint), "bytes": plan.checkpoint.nbytes},
        "model": None if info is None else {"class": info.class_name,
                                            "model_type": info.model_type,
                                            "tensors": len(info.unique()), "bytes": info.nbytes,
                                            # (the header's words: kept, or dequantized to)
                                            "quantization": quantized_text(plan) or None},
        "mapping": {"key": plan.mapping.key, "reason": plan.mapping.reason,
                    "transforms": [t.describe() for t in plan.transforms],
                    "submodules": [submodule_to_dict(s) for s in plan.mapping.submodules]},
        "rows": [asdict(r) for r in mapping_rows(plan.conversions, disk_status(plan))],
        "read_bytes": plan.read_bytes,
        "model_bytes": plan.model_bytes,
        "peak_bytes": plan.peak_bytes,
        "atomic_bytes": plan.atomic_bytes,
        "peak_at": peak_at(plan),
        "window_bytes": plan.schedule.window_bytes,
        "machine": machine_fit(plan.schedule, plan.model_bytes).to_dict(),
        "threads": plan.options.threads,
        "budget": plan.options.budget,
        "missing": sorted(plan.missing),
        "unexpected": sorted(plan.unexpected),
        "mismatched": {k: {"checkpoint_shape": list(v.checkpoint_shape),
                           "model_shape": list(v.model_shape)}
                       for k, v in sorted(plan.mismatched.items())},
        "problems": [p.to_dict() for p in plan.problems],
        "notes": [{"key": n.key, "message": n.message} for n in plan.notes],
        "steps": len(plan.schedule.steps),
        "timeline": [{"event": p.event.kind.value, "step": p.event.step,
                      "number": p.event.step + 1, "label": p.label,
                      "resident": p.resident, "in_flight": p.in_flight,
                      "intermediate": p.intermediate} for p in plan.schedule.timeline],
        "tensor_parallel": parallel_to_dict(plan),
        **placement_entries(plan),
    }
    if plan.adapter is not None:  # (only then: plans without one print as they did)
        data["adapter"] = adapter_dict(plan.adapter)
    return data


def peak_at(plan: LoadPlanData | WritePlanData) -> dict[str, Any] | None:
    """Where the peak is: ``step`` counts from 0 (as ``timeline``'s), ``number`` of ``of``
    is what the text and pictures say ("step 21/21")."""
    peak = plan.schedule.peak
    if peak is None:
        return None
    return {"step": peak.event.step, "number": peak.event.step + 1,
            "of": len(plan.schedule.steps), "label": peak.label}


def placement_entries(plan: LoadPlanData) -> dict[str, Any]:
    """With an automatic ``device_map``: the map, the peaks and the table; FP8 dequantizes'
    sides where they matter (else nothing: other plans' data stays as it was)."""
    placement, sided = plan.options.placement, plan.options.dequantize
    out: dict[str, Any] = {}
    if sided is not None:  # (FP8 only; shown when the side matters)
        from weightplan.viz.dequant import dequant_dict, shown

        out = {"dequantize": dequant_dict(sided)} if shown(sided) else {}
    if placement is None:
        return out
    return {"device_map": plan.device_map, "device_peaks": plan.device_peaks,
            "devices": placement_dict(placement), **out}


def parallel_to_dict(plan: LoadPlanData) -> dict[str, Any] | None:
    """This rank's part of a tensor-parallel plan (``None`` without ``tp=``)."""
    s = plan.sharding
    if s is None:
        return None
    return {"rank": s.rank, "world_size": s.world_size, "source": s.plan.source,
            "output": s.output, "dry_run": s.mesh is None,
            "read_bytes": sum(p.needed_bytes for p in plan.schedule.steps),
            "held_bytes": plan.held_bytes, "replicated_bytes": plan.replicated_bytes,
            "placements": {k: str(v.placement) for k, v in sorted(s.plan.params.items())}}


def write_plan_to_dict(plan: WritePlanData) -> dict[str, Any]:
    return {
        "direction": plan.direction.value,
        "inversion": plan.inversion.value,
        "directory": plan.directory,
        "files": list(plan.layout.names),
        "tensors": len(plan.layout.locations),
        "bytes": plan.layout.total_bytes,
        "mapping": {"key": plan.mapping.key, "reason": plan.mapping.reason,
                    "transforms": [t.describe() for t in plan.transforms]},
        "rows": [asdict(r) for r in mapping_rows(plan.conversions)],
        "peak_bytes": plan.peak_bytes,
        "peak_at": peak_at(plan),
        "notes": [n.message for n in plan.notes],
    }


def submodule_to_dict(s: SubmoduleMapping) -> dict[str, Any]:
    """One entry of the depth-first mapping lookup (``planner.registry.SubmoduleMapping``)."""
    return {"path": s.path, "class": s.class_name, "model_type": s.model_type,
            "identifier": s.identifier, "via": s.via.value, "key": s.key,
            "source": s.source.value, "applied": s.applied, "skipped_for": s.skipped_for,
            "scope": s.path or None, "transforms": [t.describe() for t in s.transforms],
            "problems": list(s.problems), "description": s.describe()}
