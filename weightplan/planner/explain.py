"""``explain_load``: the load direction of the pipeline, from headers to a plan.

headers → mapping → routing → conversions (ops resolved, specs inferred, nodes) →
graph → steps (where bytes land) → verify → schedule (order, window, peak) → findings.
The user-facing ``weightplan.explain`` (:mod:`weightplan.api`) wraps this, adding the
transformers bridge as the mapping lookup's second source.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import torch

from weightplan.errors import MappingError, PlanError
from weightplan.planner.findings import Findings, collect_findings
from weightplan.planner.fp8_findings import with_fp8_findings
from weightplan.planner.inputs.checkpoint import Checkpoint, open_checkpoint
from weightplan.planner.inputs.model_info import ModelInfo, inspect_model
from weightplan.planner.keys.lookup import Finder, lookup_mapping, mapping_findings
from weightplan.planner.keys.registry import REGISTRY, MappingChoice
from weightplan.planner.keys.routing import Routing, route_checkpoint
from weightplan.planner.keys.transforms import LEGACY, WeightTransform
from weightplan.planner.plan import Direction, LoadPlanData, PlanOptions
from weightplan.planner.tensors.build import Conversion, SinkKind, build_conversions
from weightplan.planner.tensors.lower import StepOrder, lower
from weightplan.planner.tensors.placement import Step
from weightplan.planner.tensors.quant_build import QuantContext, quant_context, routed_checkpoint
from weightplan.planner.tensors.quant_scales import add_scale_conversions
from weightplan.planner.tensors.schedule import order_steps
from weightplan.planner.tensors.spec import parse_dtype
from weightplan.units import parse_bytes

SYNC_ENV = "WEIGHTPLAN_SYNC_LOAD"


def explain_load(model: torch.nn.Module | None, checkpoint: object, *, mapping: object = None,
                 dtype: torch.dtype | str | None = None, budget: int | str | None = None,
                 tp: object = None, quantization: object = None, threads: int = 4,
                 finder: Finder | None = None) -> LoadPlanData:
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
        finder: the mapping lookup's second source (the transformers bridge).

    Returns:
        A :class:`LoadPlanData`. Missing / unexpected / mismatched keys are reported on it;
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
    choice = choose_mapping(mapping, model, finder)
    transforms = choice.transforms + tuple(t for t in LEGACY if t not in choice.transforms)
    quant = quant_context(checkpoint, ckpt, info, model)
    routing, conversions, kept_problems = _convert(ckpt, transforms, info, options, quant)
    graph, schedule = lower(conversions, ckpt, order=_checkpoint_order(ckpt),
                            threads=options.threads, budget=options.budget)
    findings = collect_findings(info, routing, conversions)
    findings = with_fp8_findings(findings, quant, conversions, kept_problems)
    looked_up = mapping is None and model is not None
    findings = _with_mapping_findings(findings, choice, looked_up=looked_up)
    return LoadPlanData(Direction.LOAD, ckpt, choice, transforms, conversions, graph, schedule,
                        options, model, info, routing, findings)


def _convert(ckpt: Checkpoint, transforms: tuple[WeightTransform, ...], info: ModelInfo | None,
             options: PlanOptions, quant: QuantContext | None
             ) -> tuple[Routing, tuple[Conversion, ...], tuple[tuple[str, str], ...]]:
    """Routing and conversions; FP8 scales travel with their weights (see quant_build)."""
    routing = route_checkpoint(routed_checkpoint(ckpt, quant), transforms, info)
    conversions = build_conversions(routing.groups, info, options.dtype, SinkKind.MODEL, quant)
    conversions, kept_problems = add_scale_conversions(conversions, quant, info)
    return routing, conversions, kept_problems


def _checkpoint_order(ckpt: Checkpoint) -> StepOrder:
    files = [f.path for f in ckpt.files]

    def order(steps: Sequence[Step]) -> tuple[Step, ...]:
        return order_steps(steps, files)

    return order


def choose_mapping(mapping: object, model: torch.nn.Module | None,
                   finder: Finder | None = None) -> MappingChoice:
    """The transforms for ``mapping``; ``None`` looks the model's submodules up (SPEC §5),
    asking ``finder`` where the registry has nothing."""
    if mapping is None:
        if model is None:
            return MappingChoice(None, "no model and no mapping: keys are used as they are", ())
        return lookup_mapping(model, REGISTRY, bridge=finder)
    if isinstance(mapping, str):
        return MappingChoice(mapping, f"requested mapping {mapping!r}", tuple(REGISTRY.get(mapping)))
    if isinstance(mapping, Sequence) and all(isinstance(t, WeightTransform) for t in mapping):
        return MappingChoice(None, f"{len(mapping)} transforms given", tuple(mapping))
    raise MappingError(f"mapping must be None, a registered name or a list of transforms, "
                       f"got {mapping!r}")


def _with_mapping_findings(findings: Findings, choice: MappingChoice, *, looked_up: bool
                           ) -> Findings:
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
