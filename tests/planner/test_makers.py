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
