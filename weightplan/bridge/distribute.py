"""A transformers model made ready to run under tensor (and expert) parallelism.

``from_pretrained(dir, tp=...)`` must return a model whose forward runs on every rank, as
transformers' ``tp_plan="auto"`` does: each sharded parameter becomes a meta ``DTensor``
with its style's placement, and each planned module's forward is wrapped to gather or
reduce what crosses ranks. transformers' own functions do both
(``apply_tensor_parallelism`` for the TP styles, ``apply_expert_parallelism`` for
``grouped_gemm`` / ``ep_dispatch_experts``); weightplan only expands the rules ``tp``
resolves to (:func:`~weightplan.planner.inputs.parallel_plan.plan_rules`, the same ones the
load plan matches) into one entry per module and parameter, as transformers'
``_expand_parallel_plan`` does. The load then writes each rank's part into the prepared
``DTensor``\\ s (their placements are the plan).

For a model built by hand, the same calls (:mod:`weightplan.parallel` shows them).
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

from weightplan.errors import ParallelError
from weightplan.planner.core.sharding import styles
from weightplan.planner.core.sharding.advice import NO_TP_PLAN
from weightplan.planner.core.sharding.config import TensorParallel
from weightplan.planner.inputs.parallel_plan import plan_rules

EXPERT_STYLES = frozenset({"grouped_gemm", "ep_dispatch_experts"})  # apply_expert_parallelism's
MLA_HEAD_PROJECTIONS = ("q_b_proj", "kv_b_proj")  # their output rows are whole query heads


def prepare_tensor_parallel(model: nn.Module, tp: TensorParallel, mesh: Any) -> nn.Module:
    """Shard ``model``'s parameters as meta ``DTensor``\\ s on ``mesh`` and wrap its planned
    modules' forwards with transformers' TP/EP utilities; returns the model.

    Raises:
        ParallelError: transformers (5.x with ``transformers.distributed``) is missing, the
            model has no plan, a rule's style is one weightplan can't place (unknown, or
            5.25's ``unit_colwise``), a head would be cut in two, or transformers refuses
            the plan (experts that don't split over the ranks); the message says which.
    """
    tp_apply, ep_apply = _transformers_engine()
    rules = plan_rules(model, tp)
    if not rules:
        raise ParallelError(f"{type(model).__name__} has no tp_plan: {NO_TP_PLAN.python}")
    entries = expand_rules(model, rules)
    _check_styles(model, rules)
    dense = {name: style for name, style in entries.items() if style not in EXPERT_STYLES}
    _check_heads(model, dense, mesh.size())
    experts = {name: style for name, style in entries.items() if style in EXPERT_STYLES}
    try:
        tp_apply(_TransformersView(model), mesh, dense)
        if experts:  # one 1-D mesh: the expert group is the TP group, sharing one batch
            ep_apply(model, mesh, mesh, experts, ep_implementation="auto")
    except Exception as e:  # transformers raises KeyError / ValueError / RuntimeError
        raise ParallelError(f"transformers can't prepare {type(model).__name__} for tensor "
                            f"parallelism over {mesh.size()} ranks: {type(e).__name__}: {e}"
                            ) from e
    _mark_distributed(model, mesh, bool(experts))
    return model


def expand_rules(model: nn.Module, rules: dict[str, str]) -> dict[str, str]:
    """One entry per parameter (its own rule, else its module's) and per module (its own
    rule), modules in ``named_modules`` order, each one's parameters before it. A tied
    parameter's other names have none: it is one tensor, sharded once under the name
    ``named_parameters`` gives it (a tied ``lm_head.weight`` was a name transformers' TP
    utilities don't know: KeyError; transformers shards before it ties)."""
    compiled = [(re.compile(r"[^.]+".join(map(re.escape, rule.split("*")))), style)
                for rule, style in rules.items()]

    def style_of(name: str) -> str | None:
        return next((style for pattern, style in compiled if pattern.fullmatch(name)), None)

    named = {name for name, _ in model.named_parameters()}
    out: dict[str, str] = {}
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            name = f"{module_name}.{param_name}" if module_name else param_name
            if name not in named:
                continue
            style = style_of(name) or (style_of(module_name) if module_name else None)
            if style is not None:
                out[name] = style
        own = style_of(module_name) if module_name else None
        if own is not None:
            out[module_name] = own
    return out


def heads_problem(model: nn.Module, tp: TensorParallel, world: int) -> str | None:
    """Why a model prepared for ``world`` ranks can't run (:func:`prepare_tensor_parallel`
    would refuse it: a head cut in two), or ``None``; for a dry run, which plans the bytes
    of such a load all the same."""
    try:
        dense = {name: style for name, style in expand_rules(model, plan_rules(model, tp)).items()
                 if style not in EXPERT_STYLES}
        _check_heads(model, dense, world)
    except ParallelError as e:
        return str(e)
    except ImportError:  # (no transformers.distributed: nothing to run it with anyway)
        return None
    return None


def _check_styles(model: nn.Module, rules: dict[str, str]) -> None:
    """Every rule's style is one the load plan places (the same test as the plan's)."""
    bad = {rule: style for rule, style in rules.items() if not styles.known(style)}
    if bad:
        rule, style = next(iter(bad.items()))
        raise ParallelError(f"{type(model).__name__}: plan entry {rule!r}: "
                            f"{styles.unknown_message(style)}"
                            + (f" (and {len(bad) - 1} more entries)" if len(bad) > 1 else ""))


def _check_heads(model: nn.Module, dense: dict[str, str], world: int) -> None:
    """Column-sharded key projections split the attention heads over the ranks: a head cut
    in two can't run (transformers' forward fails on reshaping it), so refuse it now. MLA's
    per-head up projections (``q_b_proj``, ``kv_b_proj``: column-sharded from transformers
    5.25 on) split the query heads the same way."""
    from transformers.distributed.tensor_parallel import get_kv_heads_per_rank

    config: Any = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    if isinstance(heads, int) and heads % world and any(
            key.rsplit(".", 1)[-1] in MLA_HEAD_PROJECTIONS and style == "colwise"
            for key, style in dense.items()):
        raise ParallelError(f"{type(model).__name__}: num_attention_heads={heads} doesn't "
                            f"split over {world} ranks, and its MLA projections (q_b_proj, "
                            "kv_b_proj) are column-sharded: a head would be cut in two and "
                            f"the attention can't run; use a number of ranks dividing {heads}")
    for field in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(text, field, None)
        if isinstance(heads, int) and get_kv_heads_per_rank(dense, heads, world) is None:
            raise ParallelError(f"{type(model).__name__}: {field}={heads} doesn't split over "
                                f"{world} ranks, and its key projections are column-sharded: "
                                "a head would be cut in two and the attention can't run; use "
                                f"a number of ranks dividing {heads}")


class _TransformersView:
    """What ``apply_tensor_parallelism`` reads of a model: its modules and parameters, the
    text config (5.25 hands it to every style; a model built by hand has none) and the mesh
    manager (only 5.25's ``unit_*`` styles use it, refused before)."""

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        config = getattr(model, "config", None)
        self.config = config if hasattr(config, "get_text_config") else _NoConfig()
        self._mesh_manager = getattr(model, "_mesh_manager", None)

    def named_modules(self) -> Any:
        return self._model.named_modules()

    def named_parameters(self) -> Any:
        return self._model.named_parameters()


class _NoConfig:
    def get_text_config(self) -> _NoConfig:
        return self


def _transformers_engine() -> tuple[Any, Any]:
    try:
        from transformers.distributed.expert_parallel import apply_expert_parallelism
        from transformers.integrations.tensor_parallel import apply_tensor_parallelism
    except ImportError as e:
        raise ParallelError("a model that runs under tp= is prepared by transformers' tensor "
                            "parallel utilities (transformers 5.x with transformers.distributed),"
                            f" which can't be imported: {e}") from e
    return apply_tensor_parallelism, apply_expert_parallelism


def _mark_distributed(model: nn.Module, mesh: Any, experts: bool) -> None:
    """What transformers' ``maybe_distribute_model`` records on the model: generation's cache
    sizes (``_tp_size``), continuous batching (``_device_mesh``), ``save_pretrained``'s
    gather (``config.distributed_config``)."""
    model._tp_size = mesh.size()
    model._device_mesh = mesh
    config = getattr(model, "config", None)
    if config is None:
        return
    try:
        from transformers.distributed import DistributedConfig
    except ImportError:
        return
    config.distributed_config = DistributedConfig(tp_size=mesh.size(),
                                                  ep_size=mesh.size() if experts else 1)
