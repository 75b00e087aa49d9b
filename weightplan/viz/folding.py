"""Fold indexed keys into ranges: ``layers.{0..31}.experts.{0..7}.w1.weight``."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from weightplan.planner.keys.patterns import natural_key


# a whole numeric component, matched in "." + key (no look-behind: several times faster)
_NUMBER = re.compile(r"\.([0-9]+)(?=\.|$)")


def split_numbers(key: str) -> tuple[tuple[str | None, ...], tuple[int, ...]]:
    """``("layers", None, "w")``, ``(3,)`` for ``layers.3.w``: the template and its numbers."""
    dotted = "." + key
    numbers = _NUMBER.findall(dotted)
    if not numbers:
        return _template(key), ()
    return _template(_NUMBER.sub(".\0", dotted)[1:]), tuple(map(int, numbers))


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


def fold_keys(keys: Iterable[str]) -> list[str]:
    """Fold keys that differ only in numeric components; order follows the first key."""
    templates: dict[tuple, list[tuple[int, ...]]] = {}
    first_key: dict[tuple, str] = {}
    for key in keys:
        template, numbers = split_numbers(key)
        templates.setdefault(template, []).append(numbers)
        first_key.setdefault(template, key)
    folded = []
    for template in sorted(templates, key=lambda t: natural_key(first_key[t])):
        for labels in fold_tuples(sorted(set(templates[template]))):
            it = iter(labels)
            folded.append(".".join(p if p is not None else next(it) for p in template))
    return folded
