"""Resolve a tensor-parallel plan against a model: one :class:`Placement` per parameter.

Where the styles come from (``TensorParallel.plan``):

1. the model's parameters are already ``DTensor``\\ s (prepared by transformers' or torch's
   TP utilities, on ``meta``): their placements *are* the plan;
2. ``"auto"``: ``model.tp_plan`` (plus ``model.ep_plan`` with ``experts="ep"``, whose
   rules win over TP rules on the same modules and their children), plus the
   ``embed_tokens: embedding_rowwise`` entry transformers adds to the base model;
3. a dict ``{name: style}``.

Names are matched like transformers does: ``*`` stands for one name component (a layer
index); a parameter takes its own entry, else its module's. An unknown style, or an entry
that names nothing in the model, is a :class:`PlanIssue` (reported by ``explain``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from torch import nn

from weightplan.planner.core.sharding.advice import NO_EP_PLAN, NO_TP_PLAN, UNEVEN_EXPERTS
from weightplan.planner.core.sharding.config import TensorParallel
from weightplan.planner.core.sharding import styles
from weightplan.planner.core.sharding.placements import Placement

Compiled = tuple[str, str, "re.Pattern[str]"]  # (plan entry, style, its pattern)


@dataclass(frozen=True, slots=True)
class ParamSharding:
    """Where one model parameter lives, and which plan entry said so."""

    name: str
    placement: Placement
    style: str | None = None
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class PlanIssue:
    key: str
    message: str


GIVEN = "the plan given"  # ShardingPlan.source of a {glob: style} plan from the user


@dataclass(frozen=True)
class ShardingPlan:
    """The resolved plan: placements of the parameters the plan shards or replicates."""

    source: str
    params: Mapping[str, ParamSharding]
    issues: tuple[PlanIssue, ...] = ()
    mesh: Any = field(default=None, compare=False)  # from DTensor parameters

    def placement(self, name: str) -> Placement:
        entry = self.params.get(name)
        return Placement.plain() if entry is None else entry.placement


def resolve_sharding(model: nn.Module, tp: TensorParallel, world_size: int) -> ShardingPlan:
    """Placements of ``model``'s parameters under ``tp`` for ``world_size`` ranks."""
    from_dtensors = _dtensor_plan(model)
    if from_dtensors is not None:
        return from_dtensors
    if tp.plan == "auto":
        rules, source, issues = _auto_rules(model, tp.experts)
    else:
        rules, source, issues = dict(tp.plan_entries()), GIVEN, []
    return _apply_rules(model, rules, source, issues, world_size)


def plan_rules(model: nn.Module, tp: TensorParallel) -> dict[str, str]:
    """The ``{name glob: style}`` rules ``tp`` takes for ``model`` (what
    :func:`resolve_sharding` matches the parameters against; also what prepares the
    modules' forwards for tensor parallelism)."""
    return _auto_rules(model, tp.experts)[0] if tp.plan == "auto" else dict(tp.plan_entries())


def _dtensor_plan(model: nn.Module) -> ShardingPlan | None:
    from torch.distributed.tensor import DTensor

    params, mesh = {}, None
    for name, param in model.named_parameters():
        if isinstance(param, DTensor):
            if len(param.placements) != 1:
                return ShardingPlan("DTensor parameters", {}, (PlanIssue(
                    name, f"placements {param.placements} are on a {param.device_mesh.ndim}-d "
                    "mesh; weightplan shards over a 1-D mesh"),))
            params[name] = ParamSharding(name, Placement.from_torch(param.placements[0])
                                         .normalized(param.dim()))
            mesh = param.device_mesh
    if not params:
        return None
    return ShardingPlan("DTensor parameters", MappingProxyType(params), (), mesh)


def dtensor_mesh(model: nn.Module) -> Any:
    """The device mesh of the model's first ``DTensor`` parameter, if any."""
    from torch.distributed.tensor import DTensor

    return next((p.device_mesh for p in model.parameters() if isinstance(p, DTensor)), None)


def _auto_rules(model: nn.Module, experts: str) -> tuple[dict[str, str], str, list[PlanIssue]]:
    tp_plan = dict(getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None) or {})
    issues: list[PlanIssue] = []
    if not tp_plan:
        issues.append(PlanIssue(type(model).__name__, f"the model has no tp_plan: {NO_TP_PLAN.python}"))
    tp_plan = _with_embedding_rule(model, tp_plan)
    if experts != "ep":
        return tp_plan, "model.tp_plan", issues
    ep_plan = dict(getattr(model, "ep_plan", None) or getattr(model, "_ep_plan", None) or {})
    if not ep_plan:
        issues.append(PlanIssue(type(model).__name__, "experts='ep' but the model has no "
                                f"ep_plan: {NO_EP_PLAN.python}"))
    expert = re.compile(_alternation(ep_plan) + r"(?:\..+)?") if ep_plan else None
    kept = {k: v for k, v in tp_plan.items() if expert is None or not expert.fullmatch(k)}
    return {**ep_plan, **kept}, "model.tp_plan + model.ep_plan", issues


def _with_embedding_rule(model: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """transformers shards the base model's ``embed_tokens`` on the vocabulary."""
    base = getattr(model, "base_model", None)
    if not plan or not isinstance(getattr(base, "embed_tokens", None), nn.Embedding):
        return plan
    prefix = next((n for n, m in model.named_modules() if m is base), "")
    name = f"{prefix}.embed_tokens" if prefix else "embed_tokens"
    if name in plan or "embed_tokens" in plan:
        return plan
    return {name: "embedding_rowwise", **plan}


def _pattern(rule: str) -> str:
    return r"[^.]+".join(re.escape(part) for part in rule.split("*"))


def _alternation(rules: Iterable[str]) -> str:
    return "(?:" + "|".join(_pattern(r) for r in rules) + ")"


def _apply_rules(model: nn.Module, rules: dict[str, str], source: str,
                 issues: list[PlanIssue], world_size: int) -> ShardingPlan:
    compiled: list[Compiled] = [(rule, style, re.compile(_pattern(rule))) for rule, style in rules.items()]
    for rule, style, _ in compiled:
        if not styles.known(style):
            issues.append(PlanIssue(rule, styles.unknown_message(style)))
    used: set[str] = set()
    for name, _ in model.named_modules():
        used.update(r for r, _, p in compiled if name and p.fullmatch(name))
    params = {}
    for name, param in model.named_parameters():
        hit = _match(name, compiled)
        if hit is None:
            continue
        rule, style = hit
        used.add(rule)
        if not styles.known(style):
            continue
        placement = styles.placement_for(style, name, param.dim())
        issue = _check_fit(name, style, tuple(param.shape), placement, world_size)
        if issue is not None:
            issues.append(issue)
            continue
        params[name] = ParamSharding(name, placement, style, rule)
    if source == GIVEN:  # the model's own tp_plan may name layers it lacks (dense MLPs of
        # an all-MoE model), as transformers' does: only a plan the user wrote is checked
        issues.extend(PlanIssue(rule, f"plan entry {rule!r} ({style}) matches no module or "
                                "parameter of the model; fix or drop it")
                      for rule, style, _ in compiled if rule not in used)
    return ShardingPlan(source, MappingProxyType(_mirror_scales(model, params)), tuple(issues))


def _mirror_scales(model: nn.Module, params: dict[str, ParamSharding]
                   ) -> dict[str, ParamSharding]:
    """FP8 scale parameters (``X.weight_scale_inv`` of ``X.weight``, ``X_scale_inv`` of
    ``X``) take their weight's placement, as transformers' ``update_parallel_plan`` does
    (the scale grid is split like the weight; :mod:`fp8_slices` checks the two agree)."""
    names = {n for n, _ in model.named_parameters()}
    out = dict(params)
    for name in names:
        if not name.endswith("_scale_inv"):
            continue
        weight = name.removesuffix("_scale_inv")
        if weight in params and weight in names:
            out[name] = ParamSharding(name, params[weight].placement, params[weight].style,
                                      params[weight].rule)
        elif weight in names:
            out.pop(name, None)  # a plain weight keeps a plain scale
    return out


def _match(name: str, compiled: list[Compiled]) -> tuple[str, str] | None:
    module = name.rpartition(".")[0]
    for target in (name, module):
        for rule, style, pattern in compiled:
            if target and pattern.fullmatch(target):
                return rule, style
    return None


def _check_fit(name: str, style: str, shape: tuple[int, ...], placement: Placement,
               world_size: int
               ) -> PlanIssue | None:
    if style in styles.EXPERT_PARALLEL and shape and shape[0] % world_size:
        return PlanIssue(name, f"{style}: {shape[0]} experts can't be split evenly over "
                         f"{world_size} ranks; {UNEVEN_EXPERTS.python} "
                         f"{shape[0]}")
    if placement.is_sharded and placement.axis >= len(shape):
        return PlanIssue(name, f"{style} shards dim {placement.dim} of a {len(shape)}-d "
                         "tensor; give this parameter another style")
    return None
