"""The :class:`WritePlan`: a checkpoint to write (saving a model, converting on disk).

Same pipeline as a load plan, read in the other direction: sources are the model's
tensors (or a checkpoint on disk), the conversions are built by the same builder, the
schedule is the same scheduler's, and the sink is a streaming, atomic file writer laid
out in advance (:mod:`weightplan.planner.write.shards`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import networkx as nx

from weightplan.planner.tensors.build import Conversion
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.findings import Note, Problem
from weightplan.planner.write.shards import ShardLayout
from weightplan.planner.plan import Explained, PlanOptions
from weightplan.planner.keys.registry import MappingChoice
from weightplan.planner.tensors.schedule import Schedule
from weightplan.planner.keys.transforms import WeightTransform

if TYPE_CHECKING:
    from weightplan.executor.report import SaveReport


@dataclass(frozen=True, eq=False)
class WritePlan(Explained):
    """What will be written where, decided before a byte is written.

    Build it with :func:`weightplan.explain_save` (or the ``convert`` command);
    ``print(plan)`` shows it, ``plan.execute()`` writes.
    """

    directory: str
    checkpoint: Checkpoint  # the sources: the model's tensors, or files
    mode: str  # "record", "mapping" or "convert"
    mapping: MappingChoice
    transforms: tuple[WeightTransform, ...]
    conversions: tuple[Conversion, ...]
    graph: nx.DiGraph
    schedule: Schedule
    layout: ShardLayout
    options: PlanOptions
    overwrite: bool
    notes: tuple[Note, ...] = ()

    # a write plan has no model side: these keep the shared explanation code simple
    model_info = None
    missing = frozenset()
    unexpected = frozenset()
    problems: tuple[Problem, ...] = ()

    @property
    def model_bytes(self) -> int:
        """Bytes of tensor data written."""
        return self.layout.total_bytes

    @property
    def files(self) -> tuple[str, ...]:
        return self.layout.names

    def execute(self, *, progress: bool | None = None) -> "SaveReport":
        """Write the checkpoint; a failure leaves no half-written file behind."""
        from weightplan.executor.execute_write import execute_write

        return execute_write(self, progress=progress)

    def to_dict(self) -> dict:
        from weightplan.viz.data import write_plan_to_dict

        return write_plan_to_dict(self)

    def __repr__(self) -> str:
        return (f"<WritePlan {self.mode} → {self.directory}: {len(self.layout.locations)} "
                f"tensors in {len(self.layout.files)} file(s)>")
