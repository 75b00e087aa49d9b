"""Explicit TP plans for tests whose point is experts split over the ranks.

transformers 5.24's default ``tp_plan`` of an MoE model split each expert over the TP ranks
(``experts.gate_up_proj: packed_colwise``, ``experts.down_proj: rowwise``, ``experts:
moe_tp_experts``); 5.25's leaves the experts whole on every rank under plain TP (they are
split by expert parallelism, the ``ep_plan``, instead). A test that means to read sliced
experts states that plan itself, so that it checks the same thing on either version.
"""

from __future__ import annotations

import re

from torch import nn

from weightplan.parallel import TensorParallel
from weightplan.planner.inputs.parallel_plan import plan_rules

# the expert-parallel style of each expert rule → its tensor-parallel style (5.24's)
_SPLIT = {"gate_up_proj": "packed_colwise", "down_proj": "rowwise", "experts": "moe_tp_experts"}


# MLA attention's projections, column/row-sharded by 5.25's DeepSeek-V3 plan, whole by 5.24's
_MLA = ("q_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")


def experts_split_plan(model: nn.Module, *, mla_whole: bool = False) -> dict[str, str]:
    """The model's own TP rules (``plan="auto"``) plus each expert split over the ranks,
    without rules that name nothing in the model (a plan given is checked for those).
    ``mla_whole``: an MLA attention (one with ``kv_b_proj``) keeps no rule either, whole on
    every rank; for Llama, Mixtral and DeepSeek-V3 that is transformers 5.24's plan."""
    rules = dict(plan_rules(model, TensorParallel(world_size=1, rank=0)))
    if mla_whole and any(name.endswith(".kv_b_proj") for name, _ in model.named_modules()):
        rules = {rule: style for rule, style in rules.items()
                 if not (".self_attn." in rule and rule.rpartition(".")[2] in _MLA)}
    for rule in (getattr(model, "ep_plan", None) or {}):
        rules[rule] = _SPLIT[rule.rpartition(".")[2]]
    names = [n for n, _ in model.named_modules()] + [n for n, _ in model.named_parameters()]
    return {rule: style for rule, style in rules.items()
            if any(_pattern(rule).fullmatch(name) for name in names)}


def _pattern(rule: str) -> re.Pattern[str]:
    return re.compile(r"[^.]+".join(map(re.escape, rule.split("*"))))
