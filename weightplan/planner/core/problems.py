"""What a plan can report about a key: problems (the load would be wrong) and notes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple


class ProblemKind(Enum):
    MISSING = "missing"
    UNEXPECTED = "unexpected"
    MISMATCH = "mismatch"
    INCOMPLETE = "incomplete"
    PARTIAL = "partial"  # a converter output has no model tensor, its siblings load
    META_BUFFER = "meta buffer"
    MAPPING = "mapping"  # part of a (bridged) mapping weightplan can't run
    QUANTIZATION = "quantization"  # FP8 that can't load right (execute refuses the plan)
    PARALLEL = "parallel"  # a tensor-parallel plan entry: unknown style, matches nothing
    LOSSY_CAST = "lossy cast"  # complex → real, float → integer, integer → bool (execute refuses)
    ADAPTER = "adapter"  # an adapter tensor or scale that would load wrong (execute refuses)


class Mismatch(NamedTuple):
    """Shapes of a converted tensor and of the model tensor it was meant for."""

    checkpoint_shape: tuple[int, ...]
    model_shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Problem:
    kind: ProblemKind
    key: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """The problem as ``plan.to_dict()`` and ``explain --json`` list it."""
        return {"kind": self.kind.value, "key": self.key, "message": self.message}


@dataclass(frozen=True, slots=True)
class Note:
    """Information that is not a problem (tied duplicates, fix-ups, casts)."""

    key: str
    message: str
