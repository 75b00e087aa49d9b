"""Fold indexed keys into ranges: ``layers.{0..31}.experts.{0..7}.w1.weight``."""

from __future__ import annotations

from collections.abc import Iterable

from weightplan.planner.keys.patterns import natural_key


def split_numbers(key: str) -> tuple[tuple[str | None, ...], tuple[int, ...]]:
    """``("layers", None, "w")``, ``(3,)`` for ``layers.3.w``: the template and its numbers."""
    parts = key.split(".")
    template = tuple(None if p.isdigit() else p for p in parts)
    return template, tuple(int(p) for p in parts if p.isdigit())


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
