"""maker(): the fast constructor equals the dataclass's own."""

from dataclasses import FrozenInstanceError, dataclass

import pytest

from weightplan.planner.keys.patterns import PatternMatch
from weightplan.planner.core.makers import maker


def test_maker_builds_what_the_constructor_builds():
    made = maker(PatternMatch)(3, 9, 7, ("a",))
    assert made == PatternMatch(3, 9, 7, ("a",))
    assert hash(made) == hash(PatternMatch(3, 9, 7, ("a",)))
    with pytest.raises(FrozenInstanceError):
        made.start = 4  # type: ignore[misc]


def test_maker_refuses_classes_whose_init_does_more():
    @dataclass(frozen=True, slots=True)
    class Checked:
        n: int

        def __post_init__(self) -> None:
            assert self.n >= 0

    @dataclass(frozen=True)
    class Plain:
        n: int

    for cls in (Checked, Plain):
        with pytest.raises(TypeError, match="slotted dataclass"):
            maker(cls)


def test_columns_build_what_the_constructor_builds():
    from itertools import repeat

    from weightplan.planner.core.makers import columns

    made = columns(PatternMatch)(3, range(3), repeat(9), [7, 8, 9], repeat(("a",)))
    assert made == [PatternMatch(j, 9, 7 + j, ("a",)) for j in range(3)]
    with pytest.raises(FrozenInstanceError):
        made[0].start = 4  # type: ignore[misc]
    with pytest.raises(TypeError, match="columns\\(\\) needs a slotted dataclass"):
        @dataclass(frozen=True)
        class Plain:
            n: int
        columns(Plain)
