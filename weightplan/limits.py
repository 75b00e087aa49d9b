"""Bounds on the work a hostile input could make unbounded, each raisable by the user.

A ``config.json`` may ask for a billion layers, ``--tp`` for a million ranks, a
``generation_config.json`` may be half a gigabyte: each is refused *before* the work,
with an error that says the limit and how to raise it. A limit is read from its
environment variable when it is checked (so the command line can raise it too), else
its default::

    WEIGHTPLAN_MAX_LAYERS=4096 weightplan explain CKPT_DIR
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    """One bound: ``default`` unless the environment variable ``name`` says otherwise."""

    name: str  # the environment variable that raises it
    default: int
    unit: str  # what is counted, plural ("layers", "bytes")

    def value(self) -> int:
        """The limit in force now (an unreadable or negative setting keeps the default)."""
        text = os.environ.get(self.name, "").strip().replace("_", "")
        try:
            value = int(text) if text else self.default
        except ValueError:
            return self.default
        return value if value >= 0 else self.default

    def exceeded_by(self, count: int | float) -> bool:
        return count > self.value()

    def hint(self) -> str:
        """``"the limit is N layers; raise it with WEIGHTPLAN_MAX_LAYERS=..."``."""
        return (f"the limit is {self.value()} {self.unit}; raise it with the environment "
                f"variable {self.name}=<larger number> if this is intended")


MAX_LAYERS = Limit("WEIGHTPLAN_MAX_LAYERS", 1024, "layers")  # frontier models: ≤ 130
MAX_EXPERTS = Limit("WEIGHTPLAN_MAX_EXPERTS", 8192, "experts")  # frontier models: ≤ 400
MAX_PLANNED_RANKS = Limit("WEIGHTPLAN_MAX_RANKS", 4096, "ranks planned in one process")
MAX_CONFIG_BYTES = Limit("WEIGHTPLAN_MAX_CONFIG_BYTES", 16 * 1024 * 1024, "bytes")
