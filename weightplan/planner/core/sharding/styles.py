"""The parallel styles transformers names in ``tp_plan`` / ``ep_plan``, as placements.

A style applied to a module applies to each of its own parameters (``q_proj`` →
``q_proj.weight`` and ``q_proj.bias``); a style may also name one parameter
(``experts.gate_up_proj``). Each style says where a parameter of a given name and rank
(number of dims) lives, exactly as transformers' ``shard_param`` does:

=============================  =============================================================
style                          placement
=============================  =============================================================
``colwise`` (+ ``_rep``,       ``Shard(ndim - 2)`` (a 1-d bias: ``Shard(0)``)
``colwise_gather_output``)
``rowwise`` (+ ``_rep``,       ``Shard(ndim - 1)``; ``bias``: ``Replicate()``
``rowwise_split_input``)
``packed_colwise``             ``_StridedShard(ndim - 2, 2)``: each rank gets its slice of the
                               gate half and of the up half (1-d: ``Shard(0)``)
``packed_rowwise``             ``_StridedShard(ndim - 1, 2)`` (1-d: ``Replicate()``)
``embedding_rowwise``          ``Shard(0)`` (``embedding_colwise``: ``Shard(1)``)
``grouped_gemm``               ``Shard(0)``: whole experts per rank (expert parallel)
``sequence_parallel``          ``Replicate()``
``replicated_with_grad_all…``  plain (whole on every rank; only gradients are reduced)
``replicate``                  plain
markers (``moe_tp_experts``,   plain: they change a module's forward, not its weights
``ep_dispatch_experts``,       (``mla_kv_a_proj``: MLA's ``kv_a_proj_with_mqa``, whole on
``mla_kv_a_proj``, …)          every rank; its forward only reduces the rope part's gradient)
=============================  =============================================================

transformers 5.25 added ``unit_colwise`` / ``unit_rowwise``: whole attention heads per rank on
a 2-D (heads × replicas) mesh, heads repeated where fewer than the ranks. weightplan places a
parameter on a 1-D mesh, so those are :data:`UNSUPPORTED`: a plan naming them is refused by
name (:func:`unknown_message`), as any style neither here nor in transformers is. 5.25 also
dropped ``moe_identity_expert`` (kept here for 5.24's models).
"""

from __future__ import annotations

from collections.abc import Callable

from weightplan.planner.core.sharding.placements import Placement

Rule = Callable[[str, int], Placement]


def _colwise(name: str, ndim: int) -> Placement:
    return Placement.shard(0 if ndim < 2 else ndim - 2)


def _rowwise(name: str, ndim: int) -> Placement:
    return Placement.replicate() if name == "bias" else Placement.shard(ndim - 1)


def _packed_colwise(name: str, ndim: int) -> Placement:
    return Placement.shard(0) if ndim < 2 else Placement.strided(ndim - 2, 2)


def _packed_rowwise(name: str, ndim: int) -> Placement:
    return Placement.replicate() if ndim < 2 else Placement.strided(ndim - 1, 2)


def _dim(d: int) -> Rule:
    return lambda name, ndim: Placement.shard(d)


def _plain(name: str, ndim: int) -> Placement:
    return Placement.plain()


def _replicated(name: str, ndim: int) -> Placement:
    return Placement.replicate()


STYLES: dict[str, Rule] = {
    "colwise": _colwise,
    "colwise_rep": _colwise,
    "colwise_gather_output": _colwise,
    "rowwise": _rowwise,
    "rowwise_rep": _rowwise,
    "rowwise_split_input": _rowwise,
    "packed_colwise": _packed_colwise,
    "packed_rowwise": _packed_rowwise,
    "embedding_rowwise": _dim(0),
    "embedding_colwise": _dim(1),
    "grouped_gemm": _dim(0),
    "sequence_parallel": _replicated,
    "replicated_with_grad_allreduce": _plain,
    "replicate": _plain,
}

# Module-level styles that change how a module runs, and shard none of its weights.
MARKERS = frozenset({"moe_tp_experts", "ep_dispatch_experts", "moe_identity_expert",
                     "local_params", "all_reduce", "mla_kv_a_proj"})

# Styles under which whole experts are spread over the ranks (expert parallel).
EXPERT_PARALLEL = frozenset({"grouped_gemm"})


# Styles transformers has that no 1-D placement expresses, and why.
UNSUPPORTED = {
    style: "keeps whole attention heads on each rank over a 2-D (heads × replicas) mesh "
           "(transformers 5.25+), which weightplan's placements on a 1-D mesh can't express; "
           f"give those modules {style.removeprefix('unit_')!r} in plan= when the heads divide "
           "over the ranks"
    for style in ("unit_colwise", "unit_rowwise")}


def known(style: str) -> bool:
    return style in STYLES or style in MARKERS


def unknown_message(style: str) -> str:
    """Why ``style`` (not :func:`known`) can't be planned, naming it and what weightplan knows."""
    if style in UNSUPPORTED:
        return f"parallel style {style!r} is not supported: it {UNSUPPORTED[style]}"
    return (f"unknown parallel style {style!r}; known: "
            f"{', '.join(sorted(STYLES) + sorted(MARKERS))}")


def placement_for(style: str, param: str, ndim: int) -> Placement:
    """Where parameter ``param`` (its last name component) of ``ndim`` dims lives."""
    rule = STYLES.get(style)
    if rule is None:
        return Placement.plain()
    placement = rule(param.rpartition(".")[2], ndim)
    if ndim == 0 and placement.is_sharded:  # (a scalar: ModelOpt's weight_scale_2)
        return Placement.replicate()
    return placement.normalized(ndim)
