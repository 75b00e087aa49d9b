"""A progress bar (bytes, GB/s, ETA) on a terminal or in a notebook; silent otherwise.

rich draws it (a live bar on terminals, a widget in Jupyter); it advances after every
read, from the reader threads (rich's progress is thread-safe). rich is imported only
when a bar is drawn or a notebook may want one: importing it costs a load without a bar
about as much as weightplan's own modules.
"""

from __future__ import annotations

import sys


def wants_progress(progress: bool | None) -> bool:
    """``None`` means: only when stderr is a terminal, or in a Jupyter notebook (which
    runs inside IPython: only then is rich asked whether this is one)."""
    if progress is None:
        if sys.stderr.isatty():
            return True
        if "IPython" not in sys.modules:
            return False
        from rich.console import Console

        return Console().is_jupyter
    return bool(progress)


class LoadProgress:
    """Context manager; ``advance(nbytes)`` from any thread."""

    def __init__(self, total_bytes: int, enabled: bool, description: str = "loading"):
        self._progress = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                TransferSpeedColumn(), TimeRemainingColumn(),
                console=Console(file=sys.stderr), transient=False)
            self._task = self._progress.add_task(description, total=total_bytes)

    def advance(self, nbytes: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, nbytes)

    def __enter__(self) -> "LoadProgress":
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
