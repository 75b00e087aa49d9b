"""columns(): objects made slot by slot, a column at a time, equal the dataclass's own."""

from dataclasses import FrozenInstanceError, dataclass
from itertools import repeat

import pytest

from weightplan.planner.core.makers import columns, fill, slot_setters
from weightplan.planner.keys.patterns import PatternMatch


def test_columns_build_what_the_constructor_builds():
    made = columns(PatternMatch)(3, range(3), repeat(9), [7, 8, 9], repeat(("a",)))
    assert made == [PatternMatch(j, 9, 7 + j, ("a",)) for j in range(3)]
    assert [hash(m) for m in made] == [hash(PatternMatch(j, 9, 7 + j, ("a",))) for j in range(3)]
    with pytest.raises(FrozenInstanceError):
        made[0].start = 4  # type: ignore[misc]


def test_columns_refuse_classes_whose_init_does_more():
    @dataclass(frozen=True, slots=True)
    class Checked:
        n: int

        def __post_init__(self) -> None:
            assert self.n >= 0

    @dataclass(frozen=True)
    class Plain:
        n: int

    for cls in (Checked, Plain):
        with pytest.raises(TypeError, match="columns\\(\\) needs a slotted dataclass"):
            columns(cls)


def test_fill_needs_a_column_for_every_setter():
    made = [object.__new__(PatternMatch) for _ in range(2)]
    with pytest.raises(ValueError):
        fill(made, slot_setters(PatternMatch, ("start", "end")), ([1, 2],))


def test_once_judges_each_distinct_object_once_and_answers_as_map():
    """``once(values, judge)`` equals ``map(judge, values)``: one object throughout (told
    at C speed: judged once), or a mix (each distinct object judged once), ``None`` too."""
    import torch

    from weightplan.planner.core.makers import once
    from weightplan.planner.core.spec import TensorSpec

    a, b = TensorSpec((2, 3), torch.int64), TensorSpec((4,), torch.int64)
    calls: list[object] = []

    def judge(spec: TensorSpec | None) -> bool:
        calls.append(spec)
        return spec is not None and len(spec.shape) == 1

    for values in ([a] * 5, [b] * 3, [a, b, a, None, b], [None, None], [b, None], []):
        calls.clear()
        got = list(once(values, judge))
        assert len(calls) == len({id(v) for v in values})  # (each distinct object once)
        assert got == [judge(v) for v in values]
