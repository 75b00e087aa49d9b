"""``WritePlan``: the planner's write plan data (a save, a conversion on disk) plus running
and printing; apart from :mod:`weightplan.api.plans` so that a load imports none of the
write side."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightplan.api.guard import call_typed, check_write_execute, guard_methods
from weightplan.planner.pipelines.write_plan import WritePlanData
from weightplan.terminal import terminal_text
from weightplan.units import counted

if TYPE_CHECKING:
    from weightplan.executor.report import SaveReport


@dataclasses.dataclass(frozen=True, eq=False)
class WritePlan(WritePlanData):
    """What will be written where, decided before a byte is written.

    Build it with :func:`weightplan.explain_save` or :func:`weightplan.explain_convert`;
    ``print(plan)`` shows it, ``plan.execute()`` writes. ``companions``: the source's
    ``config.json`` and generation config, committed next to the shards with them.
    """

    companions: tuple[Path, ...] = ()
    dequantized: bool = False  # the copy is floating: its config.json loses quantization_config
    reencoded: str | None = None  # "fp8": MXFP4 re-encoded, its config.json says block FP8

    def execute(self, *, progress: bool | None = None,
                process_group: object = None) -> SaveReport:
        """Write the checkpoint; a failure leaves no half-written file behind.
        ``process_group``: the ranks that write a tensor-parallel model together (see
        :func:`weightplan.save`); their plans are compared first (a difference is a
        ``SaveError`` on each, naming the rank and key). A rank whose ``explain_save``
        failed can't tell them from here: ``weightplan.save`` does."""
        from weightplan.api.model_config import companion_bytes
        from weightplan.executor.execute_write import execute_write

        files = call_typed("execute", companion_bytes, self.companions)
        if self.dequantized and "config.json" in files:
            from weightplan.planner.pipelines.dequantize import dequantized_config

            files["config.json"] = dequantized_config(files["config.json"])
        if self.reencoded and "config.json" in files:
            from weightplan.planner.pipelines.reencode import reencoded_config

            files["config.json"] = reencoded_config(files["config.json"])
        return call_typed("execute", execute_write, self, progress=progress, files=files,
                          process_group=process_group)

    def to_dict(self) -> dict[str, Any]:
        from weightplan.viz.data import write_plan_to_dict

        return write_plan_to_dict(self)

    def __str__(self) -> str:
        from weightplan.viz.text import explain_text

        text = explain_text(self)
        if self.companions:
            names = ", ".join(p.name for p in self.companions)
            text += terminal_text(f"copies {names} from {self.companions[0].parent} next to "
                                  "the shards") + "\n"
        return text

    def __repr__(self) -> str:
        return (f"<WritePlan {self.direction.value} ({self.inversion.value}) → "
                f"{terminal_text(str(self.directory))}: {counted(len(self.layout.locations), 'tensor')} "
                f"in {counted(len(self.layout.files), 'file')}>")


guard_methods(WritePlan, {"to_dict": None,  # (as public.py guards Plan's)
                          "execute": check_write_execute})
