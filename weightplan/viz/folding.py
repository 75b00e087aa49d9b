"""Fold indexed keys into ranges: ``layers.{0..31}.experts.{0..7}.w1.weight``."""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Iterable, Sequence

from weightplan.planner.keys.patterns import natural_key


# a whole numeric component, matched in "." + key (no look-behind: several times faster)
_NUMBER = re.compile(r"\.([0-9]+)(?=\.|$)")
# the same in many keys joined by _SEP, "." + "\x01.".join(keys): one regex pass for them
# all. A key ends at the separator or the string's end ("$" above also allows one final
# newline before it), so each key's matches are exactly those of _NUMBER on it alone.
_SEP = "\x01"
_NUMBERS = re.compile(r"\.([0-9]+)(?=\.|\n?(?:\x01|\Z))")


def split_numbers(key: str) -> tuple[tuple[str | None, ...], tuple[int, ...]]:
    """``("layers", None, "w")``, ``(3,)`` for ``layers.3.w``: the template and its numbers."""
    dotted = "." + key
    numbers = _NUMBER.findall(dotted)
    if not numbers:
        return _template(key), ()
    return _template(_NUMBER.sub(".\0", dotted)[1:]), tuple(map(int, numbers))


def _joined(keys: Sequence[str]) -> str | None:
    """``"." + "\\x01.".join(keys)``; ``None`` when a key holds the separator itself."""
    joined = "." + f"{_SEP}.".join(keys)
    return joined if joined.count(_SEP) == len(keys) - 1 else None


def shapes_of(keys: Sequence[str]) -> list[str]:
    """Each key with its numeric components replaced (``.layers.\\0.w`` for ``layers.3.w``):
    equal for two keys exactly when their :func:`split_numbers` templates are. One regex
    pass over all the keys rather than one per key."""
    joined = _joined(keys) if keys else None
    if joined is None:
        return [_NUMBER.sub(".\0", "." + key) for key in keys]
    return _NUMBERS.sub(".\0", joined).split(_SEP)


def _by_shape(keys: list[str]) -> dict[str, tuple[str, list[tuple[int, ...]]]]:
    """Keys by :func:`shapes_of`, in first-seen order: (the first key, every key's numbers).
    Two regex passes over all the keys; the per-key work left is grouping them."""
    joined = _joined(keys) if keys else None
    by: dict[str, tuple[str, list[tuple[int, ...]]]] = {}
    if joined is None or "\0" in joined:  # no keys, or odd ones: one at a time
        for key in keys:
            numbers = split_numbers(key)[1]
            by.setdefault(_NUMBER.sub(".\0", "." + key), (key, []))[1].append(numbers)
        return by
    flat = list(map(int, _NUMBERS.findall(joined)))
    shapes = _NUMBERS.sub(".\0", joined).split(_SEP)
    widths = {shape.count("\0") for shape in set(shapes)}
    rows: Iterable[tuple[int, ...]]
    if len(widths) == 1:  # n numbers in every key: read them n at a time
        n = widths.pop()
        rows = zip(*[iter(flat)] * n, strict=True) if n else itertools.repeat((), len(keys))
    else:
        each = iter(flat)
        rows = (tuple(itertools.islice(each, shape.count("\0"))) for shape in shapes)
    if shapes.count(shapes[0]) == len(shapes):  # the usual case: one shape
        return {shapes[0]: (keys[0], list(rows))}
    for key, shape, row in zip(keys, shapes, rows, strict=True):
        found = by.get(shape)
        if found is None:
            found = by[shape] = (key, [])
        found[1].append(row)
    return by


@functools.lru_cache(maxsize=1 << 12)
def _template(shape: str) -> tuple[str | None, ...]:
    """``layers.\\0.w`` → ``("layers", None, "w")`` (computed once per key shape)."""
    return tuple(None if p == "\0" else p for p in shape.split("."))


def ranges(values: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` → ``{0..2,5}``; one value stays bare."""
    vals = sorted(set(values))
    if len(vals) == 1:
        return str(vals[0])
    runs, start, prev = [], vals[0], vals[0]
    for v in vals[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        runs.append(f"{start}..{prev}" if prev > start + 1 else
                    f"{start},{prev}" if prev == start + 1 else str(start))
        if v is not None:
            start = prev = v
    return "{" + ",".join(runs) + "}"


def fold_tuples(rows: list[tuple[int, ...]]) -> list[tuple[str, ...]]:
    """Fold number tuples into as few range tuples as describe them exactly."""
    if not rows or not rows[0]:
        return [()]
    whole = _product(set(rows))
    if whole is not None:
        return whole
    by_first: dict[int, list[tuple[int, ...]]] = {}
    for row in rows:
        by_first.setdefault(row[0], []).append(row[1:])
    by_rest: dict[tuple[tuple[str, ...], ...], list[int]] = {}
    for first, rest in by_first.items():
        by_rest.setdefault(tuple(sorted(fold_tuples(rest))), []).append(first)
    out: list[tuple[str, ...]] = []
    for folded, firsts in by_rest.items():
        label = ranges(firsts)
        out.extend((label, *r) for r in folded)
    return out


def _product(rows: set[tuple[int, ...]]) -> list[tuple[str, ...]] | None:
    """One range per column when ``rows`` are every combination of their columns' values
    (layers × experts: what :func:`fold_tuples` finds row by row); else ``None``."""
    columns = [set(c) for c in zip(*rows, strict=True)]
    if len(rows) != math.prod(map(len, columns)):
        return None
    return [tuple(ranges(c) for c in columns)]


def _fold_unique(rows: set[tuple[int, ...]]) -> list[tuple[str, ...]]:
    """:func:`fold_tuples` of distinct rows (sorted only when they aren't a product)."""
    whole = _product(rows)
    return whole if whole is not None else fold_tuples(sorted(rows))


def fold_keys(keys: Iterable[str]) -> list[str]:
    """Fold keys that differ only in numeric components; order follows the first key."""
    by_shape = _by_shape(list(keys))
    folded = []
    for shape in sorted(by_shape, key=lambda s: natural_key(by_shape[s][0])):
        template = _template(shape[1:])
        for labels in _fold_unique(set(by_shape[shape][1])):
            it = iter(labels)
            folded.append(".".join(p if p is not None else next(it) for p in template))
    return folded
