"""``explain_load``: the load direction of the pipeline, from headers to a plan.

headers → mapping → routing → conversions (ops resolved, specs inferred, nodes) →
graph → steps (where bytes land) → verify → schedule (order, window, peak) → findings.
The user-facing ``weightplan.explain`` (:mod:`weightplan.api`) wraps this, adding the
transformers bridge as the mapping lookup's second source.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from weightplan.errors import MappingError, ParallelError, PlanError
from weightplan.planner.core.paused_gc import paused_gc
from weightplan.planner.core.problems import Problem, ProblemKind
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.pipelines.findings import Findings, collect_findings
from weightplan.planner.inputs.checkpoint import Checkpoint, open_checkpoint
from weightplan.planner.inputs.device import parse_device
from weightplan.planner.inputs.model_info import ModelInfo, inspect_model
from weightplan.planner.keys.lookup import Finder, lookup_mapping, mapping_findings
from weightplan.planner.keys.mappings import REGISTRY
from weightplan.planner.keys.registry import MappingChoice
from weightplan.planner.keys.route import route_checkpoint
from weightplan.planner.keys.routing import Routing
from weightplan.planner.inputs.dtype import keep_fp32, quantized_input, resolve_dtype
from weightplan.planner.keys.transforms import WeightTransform, with_legacy
from weightplan.planner.pipelines.plan import Direction, LoadPlanData, PlanOptions
from weightplan.planner.pipelines.stored_ties import shard_alike, split_stored_ties
from weightplan.planner.tensors.ir.build import (
    Conversion, SinkKind, build_conversions, shard_conversion,
)
from weightplan.planner.pipelines.lower import Lowered, StepOrder, lower
from weightplan.planner.tensors.lower.placement import Step
from weightplan.planner.tensors.schedule.schedule import Schedule, order_steps
from weightplan.units import parse_bytes

if TYPE_CHECKING:
    from weightplan.planner.pipelines.devices import AutomaticRequest
    from weightplan.planner.tensors.ir.quant_build import QuantContext
    from weightplan.planner.tensors.ir.shard_nodes import Sharding

SYNC_ENV = "WEIGHTPLAN_SYNC_LOAD"


@paused_gc
def explain_load(model: torch.nn.Module | None, checkpoint: object, *, mapping: object = None,
                 dtype: torch.dtype | str | None = None, budget: int | str | None = None,
                 tp: object = None, quantization: object = None, threads: int = 4,
                 device: object = None, finder: Finder | None = None,
                 max_memory: object = None, offload_folder: object = None,
                 cooperative: bool = False, dequantize_on: str = "auto",
                 view: Callable[[ModelInfo], ModelInfo] | None = None,
                 regroup: Callable[[Routing], Routing] | None = None) -> LoadPlanData:
    """Plan loading ``checkpoint`` into ``model`` from headers only; nothing is read or written.

    The arguments are :func:`weightplan.explain`'s (documented there), ``mapping`` given by
    name already resolved; ``finder`` is the mapping lookup's second source (the
    transformers bridge). ``device`` may be an automatic strategy (``"auto"``, ...), placed
    under ``max_memory`` (:mod:`~weightplan.planner.pipelines.devices`); ``view`` changes
    the model's view (an adapter's load: only its tensors, or its tensors kept in their
    dtype); ``regroup`` changes the routed groups (an adapter merged into its base);
    ``dequantize_on``: see ``dequant_side.py``. Returns the plan's data. The ranks of a
    cooperative load agree when they have planned (:mod:`.agreement`): one that failed
    makes the others raise instead of waiting for it.
    """
    def planned() -> LoadPlanData:
        common = prepare_load(model, checkpoint, mapping=mapping, dtype=dtype, budget=budget,
                              tp=tp, quantization=quantization, threads=threads, device=device,
                              finder=finder, max_memory=max_memory,
                              offload_folder=offload_folder, cooperative=cooperative, view=view,
                              regroup=regroup, dequantize_on=dequantize_on)
        return rank_plan(common, common.sharding)

    if tp is None:
        return planned()
    from weightplan.planner.pipelines.agreement import Agreement, planning_group

    with Agreement(planning_group(tp, cooperative), "to plan") as agreement:
        plan = planned()
        agreement.agree()
    return plan


@dataclass(frozen=True, eq=False)
class Common:
    """What a load plan holds that is the same on every rank: the sources, the routing,
    the conversions before any rank keeps its part, the findings, and the sharding of the
    rank asked for (another rank's differs only in ``rank``)."""

    model: torch.nn.Module | None
    checkpoint: Checkpoint
    options: PlanOptions
    info: ModelInfo | None
    choice: MappingChoice
    transforms: tuple[WeightTransform, ...]
    routing: Routing
    conversions: tuple[Conversion, ...]  # every rank's (no shard node yet)
    findings: Findings
    sharding: Sharding | None
    automatic: AutomaticRequest | None
    lowered: Lowered = field(default_factory=Lowered)  # the steps and fronts ranks share
    # ``sharding``'s rank's conversions (:func:`shard_conversion`); a conversion no rank
    # changes is the common one itself (``None``: not tensor parallel)
    ranked: tuple[Conversion, ...] | None = None
    dequantize_on: str = "auto"  # FP8 dequantizes sided (dequant_side.py)
    quantized: bool = False  # the checkpoint or the model has FP8 / packed weights


@paused_gc
def prepare_load(model: torch.nn.Module | None, checkpoint: object, *, mapping: object = None,
                 dtype: torch.dtype | str | None = None, budget: int | str | None = None,
                 tp: object = None, quantization: object = None, threads: int = 4,
                 device: object = None, finder: Finder | None = None,
                 max_memory: object = None, offload_folder: object = None,
                 cooperative: bool = False,
                 view: Callable[[ModelInfo], ModelInfo] | None = None,
                 regroup: Callable[[Routing], Routing] | None = None,
                 dequantize_on: str = "auto") -> Common:
    """The part of :func:`explain_load` no rank changes; each rank's plan is :func:`rank_plan`."""
    _refuse_quantization_option(quantization)
    automatic = _automatic(device, max_memory, offload_folder, model, tp)
    sharding = _sharding(model, tp, cooperative)
    ckpt = open_checkpoint(checkpoint)
    options = PlanOptions(resolve_dtype(dtype, model, ckpt), parse_threads(threads),
                          None if budget is None else parse_bytes(budget, what="budget"),
                          None if automatic is not None or device is None else parse_device(device))
    info = keep_fp32(model, inspect_model(model) if model is not None else None, options.dtype)
    if info is not None and view is not None:
        info = view(info)
    choice = choose_mapping(mapping, model, finder)
    transforms = with_legacy(choice.transforms)
    quant = _quant_context(checkpoint, ckpt, info, model)
    sharding = _kept_sharding(sharding, quant, info)
    routing, info, conversions, kept_problems = _convert(ckpt, transforms, info, options,
                                                         quant, sharding, regroup)
    sharding = shard_alike(sharding, info)  # (ties stored apart: see .stored_ties)
    found = collect_findings(info, routing, conversions, ckpt.left_out_notes())
    findings = _with_quant_findings(found, quant, conversions, kept_problems)
    findings = _with_mapping_findings(findings, choice,
                                      looked_up=mapping is None and model is not None)
    findings = _with_parallel_findings(findings, sharding)
    ranked = None if sharding is None else tuple(shard_conversion(c, sharding)
                                                 for c in conversions)
    return Common(model, ckpt, options, info, choice, transforms, routing, conversions,
                  findings, sharding, automatic, Lowered(conversions),
                  dequantize_on=dequantize_on, quantized=quant is not None, ranked=ranked)


@paused_gc
def rank_plan(common: Common, sharding: Sharding | None) -> LoadPlanData:
    """The plan of ``sharding``'s rank (``common.sharding`` or another rank of it): each
    loaded target keeps that rank's part, then lowering, verify and the schedule (and a
    cooperative load's dealing of the reads)."""
    conversions = common.conversions
    share = None
    if sharding is not None:
        conversions = _rank_conversions(common, sharding)
        if sharding.cooperative:  # (its module only then)
            from weightplan.planner.pipelines.cooperative import sharer

            share = sharer(sharding)
    options = common.options
    graph, schedule = lower(conversions, common.checkpoint,
                            order=_checkpoint_order(common.checkpoint),
                            threads=options.threads, budget=options.budget, share=share,
                            memo=None if sharding is None else common.lowered)  # (ranks share it)
    findings = common.findings
    if sharding is not None:  # (a rank's slices are known once it is lowered)
        findings = _with_split_groups(findings, sharding, schedule.steps)
    if common.automatic is not None and common.model is not None:
        options, schedule, noted = common.automatic.placed(options, common.model,
                                                           common.info, schedule)
        findings = dataclasses.replace(findings, notes=findings.notes + noted)
    if common.quantized or common.dequantize_on != "auto":  # (FP8 only: else nothing to side)
        options, schedule = _sided(options, schedule, common.dequantize_on)
    return LoadPlanData(Direction.LOAD, common.checkpoint, common.choice, common.transforms,
                        conversions, graph, schedule, options, common.model, common.info,
                        common.routing, findings, sharding,
                        None if share is None else share.exchange)


def _rank_conversions(common: Common, sharding: Sharding) -> tuple[Conversion, ...]:
    """The conversions as ``sharding``'s rank keeps them (:func:`shard_conversion`).
    Whether a rank changes a conversion doesn't depend on the rank (a target is kept whole
    by every rank, or each rank keeps its part: :func:`~weightplan.planner.tensors.ir.
    shard_nodes.shard_target`), so another rank shards again only the conversions that
    ``common.sharding``'s rank changed."""
    assert common.ranked is not None
    if sharding is common.sharding:
        return common.ranked
    return tuple(c if mine is c else shard_conversion(c, sharding)
                 for c, mine in zip(common.conversions, common.ranked, strict=True))


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
    disk = isinstance(device, Mapping) and "disk" in device.values()
    if not (isinstance(device, str) or disk) and max_memory is None and offload_folder is None:
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
    if tp is None:  # (a load that isn't tensor parallel imports no sharding module)
        if cooperative:
            raise ParallelError("cooperative=True shares the reads of the ranks of a "
                                "tensor-parallel load: pass tp= too")
        return None
    from weightplan.planner.core.sharding.config import as_tensor_parallel
    from weightplan.planner.tensors.ir.shard_nodes import plan_sharding

    tensor_parallel = as_tensor_parallel(tp)
    assert tensor_parallel is not None  # (tp is not None)
    if cooperative:
        tensor_parallel = dataclasses.replace(tensor_parallel, cooperative=True)
    if model is None:
        raise ParallelError("tp= needs a model: its tp_plan (or the plan given) names what "
                            "is sharded; pass the model built on meta")
    return plan_sharding(model, tensor_parallel)


def _kept_sharding(sharding: Sharding | None, quant: QuantContext | None,
                   info: ModelInfo | None) -> Sharding | None:
    """Keep-quantized under tensor parallel: the kept packed weights' parts placed as
    their weight's slices need (``shard_nodes.kept_sharding``)."""
    if sharding is None or quant is None or quant.packed is None or not quant.packed.kept \
            or info is None:
        return sharding
    from weightplan.planner.tensors.ir.shard_nodes import kept_sharding

    def name(key: str) -> str | None:
        for candidate in (key, key.partition(".")[2], "model." + key):
            if info.get(candidate) is not None:
                return candidate
        return None

    return kept_sharding(sharding, quant.packed.kept, name)


def _with_parallel_findings(findings: Findings, sharding: Sharding | None) -> Findings:
    if sharding is None:
        return findings
    issues = tuple(Problem(ProblemKind.PARALLEL, i.key, i.message) for i in sharding.plan.issues)
    if not issues:
        return findings
    return dataclasses.replace(findings, problems=findings.problems + issues)


def _with_split_groups(findings: Findings, sharding: Sharding,
                       steps: Sequence[Step]) -> Findings:
    """A rank's packed slices that cut a quantization group (:func:`group_split_problems`)."""
    from weightplan.planner.pipelines.packed_findings import group_split_problems

    issues = tuple(group_split_problems(steps, sharding))
    if not issues:
        return findings
    return dataclasses.replace(findings, problems=findings.problems + issues)


def _convert(ckpt: Checkpoint, transforms: tuple[WeightTransform, ...], info: ModelInfo | None,
             options: PlanOptions, quant: QuantContext | None, sharding: Sharding | None = None,
             regroup: Callable[[Routing], Routing] | None = None
             ) -> tuple[Routing, ModelInfo | None, tuple[Conversion, ...],
                        tuple[tuple[str, str], ...]]:
    """Routing, the model's view (ties stored apart split: :mod:`.stored_ties`) and the
    conversions, every rank's (``sharding``: its problems only); FP8 scales travel with
    their weights (see quant_build)."""
    if quant is not None:  # (a plain load has no scale to route with its weight)
        from weightplan.planner.tensors.ir.quant_build import route_quantized

        routing = route_quantized(ckpt, quant, transforms, info)
    else:
        routing = route_checkpoint(ckpt, transforms, info)
    if regroup is not None:
        routing = regroup(routing)
    groups = routing.groups
    info = split_stored_ties(info, groups)
    packed_problems: tuple[tuple[str, str], ...] = ()
    if quant is not None and quant.packed is not None and info is not None:
        from weightplan.planner.inputs.small_reads import SmallReader
        from weightplan.planner.tensors.ir.packed_keep import kept_groups  # (packed only)

        with SmallReader(ckpt.tensors) as small:
            groups, packed_problems = kept_groups(groups, quant.packed, _spec_of(info),
                                                  ckpt.entries.get, small.raw)
    conversions = build_conversions(groups, info, options.dtype, SinkKind.MODEL, quant,
                                    sharding)
    if quant is None:  # (nor a scale sibling)
        return routing, info, conversions, ()
    from weightplan.planner.tensors.ir.quant_scales import add_scale_conversions

    conversions, kept_problems = add_scale_conversions(conversions, quant, info,
                                                        sharding=sharding)
    fp8 = tuple((key, f"can't keep FP8: {message}") for key, message in kept_problems)
    return routing, info, conversions, fp8 + packed_problems


def _spec_of(info: ModelInfo) -> Callable[[str], TensorSpec | None]:
    """The model's spec of a name (``None``: no such tensor)."""
    def spec(name: str) -> TensorSpec | None:
        t = info.get(name)
        return None if t is None else t.spec
    return spec


def _quant_context(checkpoint: object, ckpt: Checkpoint, info: ModelInfo | None,
                   model: torch.nn.Module | None) -> QuantContext | None:
    """The FP8 / packed context of a quantized input (:func:`quantized_input`, the one
    test); ``None`` for a plain one, whose load doesn't import the quantized phases."""
    if not quantized_input(checkpoint, ckpt, info, model):
        return None
    from weightplan.planner.tensors.ir.quant_build import quant_context

    return quant_context(checkpoint, ckpt, info, model)


def _with_quant_findings(findings: Findings, quant: QuantContext | None,
                         conversions: tuple[Conversion, ...],
                         kept_problems: tuple[tuple[str, str], ...]) -> Findings:
    if quant is None:
        return findings
    from weightplan.planner.pipelines.fp8_findings import with_fp8_findings

    return with_fp8_findings(findings, quant, conversions, kept_problems)


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
