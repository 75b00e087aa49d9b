"""A status line while ``from_pretrained`` imports transformers, builds the model and
explains the load: the seconds before the load's progress bar starts.

Shown where the progress bar would be (stderr on a terminal, a notebook, or
``progress=True``): a spinner with what is happening, then one line saying what was done
and how long it took.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def status(doing: str, done: str, enabled: bool | None) -> Iterator[None]:
    """Show ``doing`` while the block runs, then ``done`` with the seconds it took."""
    from weightplan.executor.progress import wants_progress

    if not wants_progress(enabled):
        yield
        return
    from rich.console import Console

    console = Console(file=sys.stderr)
    start = time.perf_counter()
    with console.status(f"{doing}…"):
        yield
    console.print(f"{done} in {time.perf_counter() - start:.2f}s", highlight=False)
