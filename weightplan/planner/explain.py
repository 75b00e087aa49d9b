"""``explain(model, checkpoint)``: the planning pipeline, from headers to a :class:`Plan`.

headers → mapping → routing → conversions (ops resolved, specs inferred) → graph (verified)
→ programs (where bytes land) → schedule (order, window, peak) → findings.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import torch

from weightplan.errors import MappingError, PlanError
from weightplan.planner.bulk import paused_gc
from weightplan.planner.tensors.build import build_conversions
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.findings import collect_findings
from weightplan.planner.tensors.graph import build_graph
from weightplan.planner.keys.lookup import lookup_mapping, mapping_findings
from weightplan.planner.keys.routing import route_checkpoint
from weightplan.planner.inputs.model_info import inspect_model
from weightplan.planner.tensors.placement import plan_program
from weightplan.planner.plan import Plan, PlanOptions
from weightplan.planner.keys.registry import REGISTRY, MappingChoice
from weightplan.planner.tensors.budget import schedule_within
from weightplan.planner.tensors.schedule import order_programs
from weightplan.planner.tensors.spec import parse_dtype
from weightplan.planner.keys.transforms import LEGACY, WeightTransform
from weightplan.planner.tensors.verify import verify
from weightplan.units import parse_bytes

SYNC_ENV = "WEIGHTPLAN_SYNC_LOAD"


@paused_gc
def explain(model: torch.nn.Module | None, checkpoint: object, *, mapping: object = None,
            dtype: torch.dtype | str | None = None, budget: int | str | None = None,
            tp: object = None, quantization: object = None, threads: int = 4) -> Plan:
    """Plan loading ``checkpoint`` into ``model`` from headers only; nothing is read or written.

    Args:
        model: a ``torch.nn.Module`` (usually on ``meta``), or ``None`` to see what the
            keys become under ``mapping`` without a model.
        checkpoint: a ``.safetensors`` file, a directory, a list of files, or a dict.
        mapping: ``None`` (look the model's submodules up in the registry, depth first,
            each mapping scoped to its submodule; transformers models whose family isn't
            built in get transformers' own mapping through :mod:`weightplan.bridge`), a
            registered name, or a list of transforms. Legacy ``LayerNorm.gamma/beta``
            renames always apply.
        dtype: cast floating tensors of a meta model to this dtype.
        budget: bytes (or ``"8GiB"``) the load may add at most; raises
            :class:`BudgetError` with the smallest budget that works when impossible.
        tp, quantization: reserved for tensor-parallel and quantized loading.
        threads: reader threads (``0``, or ``WEIGHTPLAN_SYNC_LOAD=1``, reads inline).

    Returns:
        A :class:`Plan`. Missing / unexpected / mismatched keys are reported on it;
        configuration errors (conflicting converters, index gaps, unreadable files) raise.

    Example:
        >>> plan = explain(model, "ckpt_dir/")          # doctest: +SKIP
        >>> print(plan); plan.execute()                 # doctest: +SKIP
    """
    if tp is not None or quantization is not None:
        raise PlanError("tensor-parallel (tp=) and quantized (quantization=) loading are not "
                        "available in this version of weightplan")
    options = PlanOptions(parse_dtype(dtype), parse_threads(threads),
                          None if budget is None else parse_bytes(budget, what="budget"))
    ckpt = open_checkpoint(checkpoint)
    info = inspect_model(model) if model is not None else None
    choice = choose_mapping(mapping, model)
    transforms = choice.transforms + tuple(t for t in LEGACY if t not in choice.transforms)
    routing = route_checkpoint(ckpt, transforms, info)
    conversions = build_conversions(routing.groups, info, options.dtype)
    graph = build_graph(n for c in conversions for n in c.nodes)
    verify(graph)
    programs = [plan_program(c) for c in conversions if c.loads]
    files = [f.path for f in ckpt.files]
    schedule = schedule_within(order_programs(programs, files), options)
    findings = collect_findings(info, routing, conversions)
    looked_up = mapping is None and model is not None
    findings = _with_mapping_findings(findings, choice, looked_up=looked_up)
    return Plan(model, ckpt, info, choice, transforms, routing, conversions, graph, schedule,
                findings, options)


def choose_mapping(mapping: object, model: torch.nn.Module | None) -> MappingChoice:
    """The transforms for ``mapping``; ``None`` looks the model's submodules up (SPEC §5)."""
    if mapping is None:
        if model is None:
            return MappingChoice(None, "no model and no mapping: keys are used as they are", ())
        return lookup_mapping(model, REGISTRY, bridge=_bridge_for(model))
    if isinstance(mapping, str):
        return MappingChoice(mapping, f"requested mapping {mapping!r}", tuple(REGISTRY.get(mapping)))
    if isinstance(mapping, Sequence) and all(isinstance(t, WeightTransform) for t in mapping):
        return MappingChoice(None, f"{len(mapping)} transforms given", tuple(mapping))
    raise MappingError(f"mapping must be None, a registered name or a list of transforms, "
                       f"got {mapping!r}")


def _bridge_for(model: torch.nn.Module):
    """transformers' own mappings, for transformers models whose family isn't built in."""
    from weightplan.planner.keys.lookup import is_transformers_class

    if not any(is_transformers_class(m) for m in model.modules()):
        return None
    from weightplan.bridge.transformers import TransformersFinder

    return TransformersFinder()


def _with_mapping_findings(findings, choice: MappingChoice, *, looked_up: bool):
    problems, notes = mapping_findings(choice, looked_up=looked_up)
    if not problems and not notes:
        return findings
    return dataclasses.replace(findings, problems=tuple(problems) + findings.problems,
                               notes=tuple(notes) + findings.notes)


def parse_threads(threads: int) -> int:
    if os.environ.get(SYNC_ENV, "").strip() not in ("", "0"):
        return 0
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise PlanError(f"threads must be a non-negative int, got {threads!r}")
    return threads
