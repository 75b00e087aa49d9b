"""Saving a model no weightplan load recorded: which transforms can still be inverted.

Like transformers' ``revert_weight_conversion`` fallback for models built or loaded
elsewhere, every :class:`PrefixChange` is left out: whether the original checkpoint had
the prefix is unknown, so the keys are written as the rest of the mapping gives them.
"""

from __future__ import annotations

import dataclasses

from weightplan.planner.keys.registry import MappingChoice
from weightplan.planner.keys.transforms import PrefixChange
from weightplan.units import counted


def without_prefix_changes(choice: MappingChoice) -> MappingChoice:
    kept = tuple(t for t in choice.transforms if not isinstance(t, PrefixChange))
    if len(kept) == len(choice.transforms):
        return choice
    dropped = len(choice.transforms) - len(kept)
    return dataclasses.replace(
        choice, transforms=kept,
        reason=f"{choice.reason}; {counted(dropped, 'prefix change')} left out (no load record)")
