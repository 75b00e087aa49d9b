"""Ties a model declares, whether or not its tensors are still the same object.

A transformers model ties ``lm_head.weight`` to the input embeddings in ``post_init`` by
assigning one parameter to two modules. Building under accelerate's
``init_empty_weights()`` breaks that: its ``register_parameter`` hook gives the second
module a fresh meta parameter. The declaration survives, so the planner reads it and groups
the names again (one tensor, two names), exactly as ``from_pretrained`` ties after loading.

transformers 5.x declares ties as ``_tied_weights_keys = {target: source}`` (regexes or
module names allowed), expanded by ``get_expanded_tied_weights_keys(all_submodels=True)``;
this module uses that method when it exists and the plain dict otherwise (feature detection,
no version pins). Models without a declaration have no ties beyond shared objects.
"""

from __future__ import annotations

import torch


def declared_ties(model: torch.nn.Module) -> dict[str, str]:
    """``{tied name: source name}`` the model declares (empty when it declares none)."""
    expand = getattr(model, "get_expanded_tied_weights_keys", None)
    if callable(expand):
        try:
            return dict(expand(all_submodels=True))
        except Exception:  # a custom declaration transformers itself can't expand
            return {}
    return _plain_declaration(model)


def _plain_declaration(model: torch.nn.Module) -> dict[str, str]:
    config = getattr(model, "config", None)
    keys = getattr(model, "_tied_weights_keys", None)
    if not isinstance(keys, dict) or not getattr(config, "tie_word_embeddings", False):
        return {}
    return {str(k): str(v) for k, v in keys.items()}


def tie_groups(model: torch.nn.Module, names: set[str]) -> list[tuple[str, ...]]:
    """Declared ties as groups of names (source first), limited to names the model has."""
    groups: dict[str, list[str]] = {}
    for target, source in declared_ties(model).items():
        if target in names and source in names and target != source:
            groups.setdefault(source, [source]).append(target)
    return [tuple(g) for g in groups.values()]
