"""Planning runs with the cyclic collector paused, and puts it back as it was."""

import gc

import pytest

from weightplan.planner.core.paused_gc import paused_gc


def test_paused_inside_restored_after_even_on_error():
    seen = []

    @paused_gc
    def inner():
        seen.append(gc.isenabled())

    @paused_gc
    def outer():
        inner()
        seen.append(gc.isenabled())  # the inner call did not turn it back on
        raise ValueError

    assert gc.isenabled()
    with pytest.raises(ValueError):
        outer()
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        inner()
        assert not gc.isenabled()  # left off: it was off before
    finally:
        gc.enable()


def test_planning_leaves_objects_the_process_froze_frozen():
    import gc

    from weightplan.planner.core.paused_gc import paused_gc

    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        paused_gc(lambda: [object() for _ in range(10)])()
        # unfreezing would empty the permanent generation; a frozen object that some other
        # code frees meanwhile (refcounts still work there) may take a few away
        assert gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()
