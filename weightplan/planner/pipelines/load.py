"""``explain_load``: the load direction of the pipeline, from headers to a plan.

headers → mapping → routing → conversions (ops resolved, specs inferred, nodes) →
graph → steps (where bytes land) → verify → schedule (order, window, peak) → findings.
The user-facing ``weightplan.explain`` (:mod:`weightplan.api`) wraps this, adding the
transformers bridge as the mapping lookup's second source.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from weightplan.errors import MappingError, ParallelError, PlanError
from weightplan.planner.core.paused_gc import paused_gc
from weightplan.planner.core.problems import Problem, ProblemKind
from weightplan.planner.pipelines.findings import Findings, collect_findings
from weightplan.planner.pipelines.fp8_findings import with_fp8_findings
from weightplan.planner.core.sharding.config import as_tensor_parallel
from weightplan.planner.inputs.checkpoint import Checkpoint, open_checkpoint
from weightplan.planner.inputs.device import parse_device
from weightplan.planner.inputs.model_info import ModelInfo, inspect_model
from weightplan.planner.keys.lookup import Finder, lookup_mapping, mapping_findings
from weightplan.planner.keys.mappings import REGISTRY
from weightplan.planner.keys.registry import MappingChoice
from weightplan.planner.keys.route import route_checkpoint
from weightplan.planner.keys.routing import Routing
from weightplan.planner.inputs.dtype import keep_fp32, resolve_dtype
from weightplan.planner.keys.transforms import WeightTransform, with_legacy
from weightplan.planner.pipelines.plan import Direction, LoadPlanData, PlanOptions
from weightplan.planner.tensors.ir.build import Conversion, SinkKind, build_conversions
from weightplan.planner.pipelines.lower import StepOrder, lower
from weightplan.planner.tensors.lower.placement import Step
from weightplan.planner.tensors.ir.quant_build import QuantContext, quant_context, routed_checkpoint
from weightplan.planner.tensors.ir.quant_scales import add_scale_conversions
from weightplan.planner.tensors.schedule.schedule import Schedule, order_steps
from weightplan.planner.tensors.ir.shard_nodes import Sharding, plan_sharding
from weightplan.units import parse_bytes

if TYPE_CHECKING:
    from weightplan.planner.pipelines.devices import AutomaticRequest

SYNC_ENV = "WEIGHTPLAN_SYNC_LOAD"


@paused_gc
def explain_load(model: torch.nn.Module | None, checkpoint: object, *, mapping: object = None,
                 dtype: torch.dtype | str | None = None, budget: int | str | None = None,
                 tp: object = None, quantization: object = None, threads: int = 4,
                 device: object = None, finder: Finder | None = None,
                 max_memory: object = None, offload_folder: object = None,
                 cooperative: bool = False, dequantize_on: str = "auto",
                 view: Callable[[ModelInfo], ModelInfo] | None = None) -> LoadPlanData:
    """Plan loading ``checkpoint`` into ``model`` from headers only; nothing is read or written.

    The arguments are :func:`weightplan.explain`'s (documented there), ``mapping`` given by
    name already resolved; ``finder`` is the mapping lookup's second source (the
    transformers bridge). ``device`` may be an automatic strategy (``"auto"``, ...), placed
    under ``max_memory`` (:mod:`~weightplan.planner.pipelines.devices`); ``view`` changes
    the model's view (an adapter's load: only its tensors, or its tensors kept in their
    dtype); ``dequantize_on``: see ``dequant_side.py``. Returns the plan's data.
    """
    _refuse_quantization_option(quantization)
    automatic = _automatic(device, max_memory, offload_folder, model, tp)
    sharding = _sharding(model, tp, cooperative)
    ckpt = open_checkpoint(checkpoint)
    options = PlanOptions(resolve_dtype(dtype, model, ckpt), parse_threads(threads),
                          None if budget is None else parse_bytes(budget, what="budget"),
                          None if automatic is not None else parse_device(device))
    info = keep_fp32(model, inspect_model(model) if model is not None else None, options.dtype)
    if info is not None and view is not None:
        info = view(info)
    choice = choose_mapping(mapping, model, finder)
    transforms = with_legacy(choice.transforms)
    quant = quant_context(checkpoint, ckpt, info, model)
    routing, conversions, kept_problems = _convert(ckpt, transforms, info, options, quant,
                                                   sharding)
    share = None
    if sharding is not None and sharding.cooperative:  # (its module only then)
        from weightplan.planner.pipelines.cooperative import sharer

        share = sharer(sharding)
    graph, schedule = lower(conversions, ckpt, order=_checkpoint_order(ckpt),
                            threads=options.threads, budget=options.budget, share=share)
    findings = with_fp8_findings(collect_findings(info, routing, conversions), quant,
                                 conversions, kept_problems)
    findings = _with_mapping_findings(findings, choice,
                                      looked_up=mapping is None and model is not None)
    findings = _with_parallel_findings(findings, sharding)
    if automatic is not None and model is not None:
        options, schedule = automatic.placed(options, model, info, schedule)
    if quant is not None or dequantize_on != "auto":  # (FP8 only: else nothing to side)
        options, schedule = _sided(options, schedule, dequantize_on)
    return LoadPlanData(Direction.LOAD, ckpt, choice, transforms, conversions, graph, schedule,
                        options, model, info, routing, findings, sharding,
                        None if share is None else share.exchange)


def _sided(options: PlanOptions, schedule: Schedule, mode: str
           ) -> tuple[PlanOptions, Schedule]:
    """FP8 dequantizes sided host or device (see dequant_side.py)."""
    from weightplan.planner.tensors.schedule.dequant_side import check_mode, place_dequantize

    schedule, sides = place_dequantize(schedule, options.devices, check_mode(mode))
    return dataclasses.replace(options, dequantize=sides), schedule


def _automatic(device: object, max_memory: object, offload_folder: object,
               model: torch.nn.Module | None, tp: object) -> AutomaticRequest | None:
    """An automatic placement's request (a strategy named, or its keywords given; the
    devices module judges), else ``None`` without importing it."""
    if not isinstance(device, str) and max_memory is None and offload_folder is None:
        return None
    from weightplan.planner.pipelines.devices import automatic_request

    return automatic_request(device, max_memory, offload_folder, model, tp)


def _refuse_quantization_option(quantization: object) -> None:
    if quantization is not None:  # reserved: the model and the checkpoint decide
        raise PlanError("quantization= is not an option: weightplan follows the model and the "
                        "checkpoint (FP8 weights dequantize into floating parameters, stay FP8 "
                        "in FP8 parameters, and are quantized for FP8 models)")


def _sharding(model: torch.nn.Module | None, tp: object, cooperative: bool = False
              ) -> Sharding | None:
    tensor_parallel = as_tensor_parallel(tp)
    if tensor_parallel is None:
        if cooperative:
            raise ParallelError("cooperative=True shares the reads of the ranks of a "
                                "tensor-parallel load: pass tp= too")
        return None
    if cooperative:
        tensor_parallel = dataclasses.replace(tensor_parallel, cooperative=True)
    if model is None:
        raise ParallelError("tp= needs a model: its tp_plan (or the plan given) names what "
                            "is sharded; pass the model built on meta")
    return plan_sharding(model, tensor_parallel)


def _with_parallel_findings(findings: Findings, sharding: Sharding | None) -> Findings:
    if sharding is None:
        return findings
    issues = tuple(Problem(ProblemKind.PARALLEL, i.key, i.message) for i in sharding.plan.issues)
    issues += tuple(Problem(ProblemKind.PARALLEL, k, f"{k} is sharded but not in the "
                            "checkpoint: it would be initialized whole, as a plain tensor, on "
                            "every rank") for k in sorted(findings.missing)
                    if sharding.plan.placement(k).is_dtensor)
    if not issues:
        return findings
    return dataclasses.replace(findings, problems=findings.problems + issues)


def _convert(ckpt: Checkpoint, transforms: tuple[WeightTransform, ...], info: ModelInfo | None,
             options: PlanOptions, quant: QuantContext | None, sharding: Sharding | None = None
             ) -> tuple[Routing, tuple[Conversion, ...], tuple[tuple[str, str], ...]]:
    """Routing and conversions; FP8 scales travel with their weights (see quant_build)."""
    routing = route_checkpoint(routed_checkpoint(ckpt, quant), transforms, info)
    conversions = build_conversions(routing.groups, info, options.dtype, SinkKind.MODEL, quant,
                                    sharding)
    conversions, kept_problems = add_scale_conversions(conversions, quant, info,
                                                        sharding=sharding)
    return routing, conversions, kept_problems


def _checkpoint_order(ckpt: Checkpoint) -> StepOrder:
    files = [f.path for f in ckpt.files]

    def order(steps: Iterable[Step]) -> tuple[Step, ...]:
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
    if isinstance(mapping, MappingChoice):  # resolved above the planner (bridged names)
        return mapping
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
