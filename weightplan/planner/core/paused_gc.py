"""Planning allocates ~10 objects per checkpoint key and frees almost none of them until
the plan is dropped; Python's cyclic collector then re-walks the whole growing heap again
and again (on a 92k-key checkpoint it was ~40% of ``explain()``). Planning makes no
reference cycles worth collecting, so it runs with the collector paused, and hands what it
made to the oldest generation when it ends."""

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
                _age_young_objects()
                gc.enable()

    return wrapper  # type: ignore[return-value]


def _age_young_objects() -> None:
    """Move every tracked object to the oldest generation, in O(1): the ~1M objects a big
    plan allocated would otherwise all sit in the youngest generation, and the first
    collection after planning would walk them (0.15-0.2 s on 92k keys) only to promote
    them. ``freeze`` moves every generation to the permanent one and ``unfreeze`` moves it
    back to the oldest, where full collections still find any garbage among them. Skipped
    when the process froze objects itself (``unfreeze`` would thaw those too: a pre-fork
    server freezes to keep pages shared)."""
    if gc.get_freeze_count():
        return
    gc.freeze()
    gc.unfreeze()
