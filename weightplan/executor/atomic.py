"""A failed load never leaves a model silently half overwritten.

Tensors on ``meta`` are allocated fresh and installed only at the commit, so a failure
leaves them untouched anyway. Tensors that are already allocated are written in place;
:class:`GuardedSink` wraps the model sink to make that safe either way:

- default: it records which in-place tensors received any byte; if the load fails after
  that, :func:`partial_load_errors` raises :class:`PartialLoadError` listing exactly
  those tensors (``.overwritten``), chained to the cause. Nothing written: the cause as is.
  An interruption (``KeyboardInterrupt``, Ctrl-C) is re-raised as it is, with a note and
  the same ``.overwritten`` list.
- ``atomic=True``: in-place tensors are staged (a copy of each, so partial writes keep
  the rest of the tensor) and copied into the model only at the commit, after every read
  succeeded and every file was verified unchanged. A failure touches nothing. The cost
  is one extra copy of the in-place tensors (``plan.atomic_bytes``), shown in the plan.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from weightplan.errors import PartialLoadError, WeightplanError
from weightplan.executor.model_sink import ModelSink, current_tensor
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import View
from weightplan.units import counted

if TYPE_CHECKING:
    from weightplan.executor.offload import OffloadFile


class GuardedSink:
    """Wraps a :class:`~weightplan.executor.model_sink.ModelSink`: tracks or stages in-place writes."""

    def __init__(self, inner: ModelSink, *, atomic: bool):
        self.inner, self.atomic = inner, atomic
        self.touched: set[str] = set()
        self._staged: dict[str, torch.Tensor] = {}

    @property
    def results(self) -> dict[str, tuple[Destination, torch.Tensor]]:
        return self.inner.results

    @property
    def initialized(self) -> dict[str, str]:
        return self.inner.initialized

    def open(self, dest: Destination) -> torch.Tensor | OffloadFile:
        if not self.atomic or dest.allocates:
            return self.inner.open(dest)
        if dest.key not in self._staged:
            current = current_tensor(self.inner.model, dest.key).detach()
            staged = torch.empty_strided(current.size(), current.stride(), dtype=current.dtype)
            self._staged[dest.key] = staged.copy_(current)
        return self._staged[dest.key]

    def write_bytes(self, handle: torch.Tensor, dest: Destination, offset: int,
                    data: torch.Tensor) -> None:
        self._note(dest)
        self.inner.write_bytes(handle, dest, offset, data)

    def byte_view(self, handle: torch.Tensor, dest: Destination, offset: int,
                  nbytes: int) -> torch.Tensor | None:
        self._note(dest)
        return self.inner.byte_view(handle, dest, offset, nbytes)

    def file_region(self, handle: torch.Tensor | OffloadFile, dest: Destination,
                    offset: int) -> tuple[int, int, str] | None:
        self._note(dest)
        return self.inner.file_region(handle, dest, offset)

    def write_view(self, handle: torch.Tensor, dest: Destination, view: View,
                   src: torch.Tensor) -> None:
        self._note(dest)
        self.inner.write_view(handle, dest, view, src)

    def update_view(self, handle: torch.Tensor, dest: Destination,
                    view: View) -> torch.Tensor:
        self._note(dest)
        return self.inner.update_view(handle, dest, view)

    def _note(self, dest: Destination) -> None:
        if not dest.allocates and not self.atomic:
            self.touched.add(dest.key)  # set.add is atomic under the GIL

    def close(self, dest: Destination, handle: torch.Tensor) -> None:
        self.inner.close(dest, handle)

    def commit(self) -> None:
        with torch.no_grad():
            for key, staged in self._staged.items():
                current_tensor(self.inner.model, key).detach().copy_(staged)
        self._staged.clear()
        self.inner.commit()

    def abort(self) -> None:
        self._staged.clear()
        self.inner.abort()


@contextlib.contextmanager
def partial_load_errors(sink: GuardedSink) -> Iterator[None]:
    """Re-raise a failure as :class:`PartialLoadError` when in-place tensors were written;
    a ``KeyboardInterrupt`` (Ctrl-C) stays one, with a note listing them and the same
    ``.overwritten`` attribute."""
    try:
        yield
    except KeyboardInterrupt as e:
        if sink.touched:
            names = sorted(sink.touched)
            e.overwritten = tuple(names)  # type: ignore[attr-defined]
            if hasattr(e, "add_note"):  # Python 3.11+: shown under the traceback
                e.add_note(f"weightplan: the load was interrupted after overwriting "
                           f"{counted(len(names), 'already-allocated tensor')} in place: "
                           f"{_shown(names)}. Those hold a mix of old and new values; the "
                           "others are untouched. Load again, or use execute(atomic=True) so "
                           "that an interruption touches nothing")
        raise
    except Exception as e:
        if not sink.touched:
            raise
        names = sorted(sink.touched)
        shown = _shown(names)
        cause = f"{type(e).__name__}: {e}" if not isinstance(e, WeightplanError) else str(e)
        raise PartialLoadError(
            f"the load failed after overwriting "
            f"{counted(len(names), 'already-allocated tensor')} in place: {shown}. Those "
            f"hold a mix of old and new values; the others are untouched. Cause: {cause}. "
            "Load again, or use execute(atomic=True) to stage in-place tensors so that a "
            "failure touches nothing", overwritten=tuple(names)
        ) from e


def _shown(names: list[str]) -> str:
    return ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
