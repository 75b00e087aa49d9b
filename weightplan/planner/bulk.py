"""Planning allocates ~10 objects per checkpoint key and frees almost none of them until
the plan is dropped; Python's cyclic collector then re-walks the whole growing heap again
and again (on a 92k-key checkpoint it was ~40% of ``explain()``). Planning makes no
reference cycles worth collecting, so it runs with the collector paused."""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable)


def paused_gc(fn: F) -> F:
    """Run ``fn`` with the cyclic garbage collector paused (re-entrant: only the outermost
    call turns it back on, and only if it was on)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return wrapper  # type: ignore[return-value]
