"""Fold indexed keys into ranges: ``layers.{0..31}.experts.{0..7}.w1.weight``."""

from __future__ import annotations

import functools
import itertools
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat

from weightplan.planner.keys.patterns import natural_key


# a whole numeric component, matched in "." + key (no look-behind: several times faster),
# written as a number writes it: "01" or "5\n" is a name (folded as 1 or 5, it was misnamed)
_NUMBER = re.compile(r"\.(0|[1-9][0-9]*)(?=\.|\Z)")
# the same in many keys joined by _SEP, "." + "\x01.".join(keys): one regex pass for them
# all. A key ends at the separator or the string's end, so each key's matches are exactly
# those of _NUMBER on it alone.
_SEP = "\x01"
_NUMBERS = re.compile(r"\.(0|[1-9][0-9]*)(?=\.|\x01|\Z)")


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


def fold_keys(*streams: Iterable[str]) -> list[str]:
    """Fold keys that differ only in numeric components into ranges, exactly.

    Args:
        *streams: the keys, in one or more streams, folded as if they were one list. A
            stream of keys alike but for one numeric component (a stack's sources:
            ``….experts.N.w``) is read whole, from its common prefix and suffix, when
            :func:`_one_number` finds it so; every other key goes through one regex pass
            (:func:`_by_shape`) with its neighbours. Both give the same rows.

    Returns:
        One line per key template and set of ranges, templates ordered by their first key.

    Example:
        >>> fold_keys([f"m.layers.{i}.w" for i in range(4)], ["lm_head.weight"])
        ['lm_head.weight', 'm.layers.{0..3}.w']
    """
    by: _Shapes = {}
    blocks: dict[str, list[_Block]] = {}
    pending: list[str] = []
    for stream in streams:
        keys = stream if isinstance(stream, (list, tuple)) else list(stream)
        one = _one_number(keys)
        if one is None:  # the regex pass, with the neighbouring streams (one batch)
            pending += keys
            continue
        if pending:
            _merge(by, _by_shape(pending))
            pending = []
        shape, block = one
        by.setdefault(shape, (keys[0], []))
        blocks.setdefault(shape, []).append(block)
    if pending:
        _merge(by, _by_shape(pending))
    return _fold(by, blocks)


# a stream this long is worth reading as prefix + number + suffix before the regex pass
_RUN = 8
_Shapes = dict[str, tuple[str, list[tuple[int, ...]]]]


@dataclass(frozen=True, slots=True)
class _Block:
    """The rows of a stream of keys alike but for one number: ``(*before, m, *after)`` for
    each ``m`` of ``middles``."""

    before: tuple[int, ...]
    middles: Sequence[int]
    after: tuple[int, ...]

    def rows(self) -> list[tuple[int, ...]]:
        n = len(self.middles)
        return list(zip(*[repeat(v, n) for v in self.before], self.middles,
                        *[repeat(v, n) for v in self.after], strict=True))


def _merge(by: _Shapes, more: _Shapes) -> None:
    """``by`` then ``more`` as :func:`_by_shape` of their keys one after the other gives."""
    for shape, (first, rows) in more.items():
        found = by.get(shape)
        if found is None:
            by[shape] = (first, rows)
        else:
            found[1].extend(rows)


def _one_number(keys: Sequence[str]) -> tuple[str, _Block] | None:
    """The shape and rows of ``keys`` (as :func:`_by_shape` has them) when each is ``prefix
    + N + suffix``, ``N`` a whole numeric component (``prefix`` ends at a dot or is empty,
    ``suffix`` starts with one or is empty); ``None``: not so, or fewer than :data:`_RUN`
    keys (the regex pass is cheaper), or a key holds a newline (which the regex's ``$``
    treats apart) or the separator."""
    if len(keys) < _RUN:
        return None
    first, n = keys[0], len(keys)
    common = os.path.commonprefix([first, keys[-1]])  # (any two: all are checked below)
    prefix = common[:common.rfind(".") + 1]
    middle, dot, rest = first[len(prefix):].partition(".")
    suffix = dot + rest
    if "\n" in first or not keys[-1].endswith(suffix):  # (a cheap no, before the join)
        return None
    joined = _SEP.join(keys)
    if joined.count(_SEP) != n - 1 or not joined.endswith(suffix):
        return None
    # every key is prefix + N + suffix exactly when the text between the first prefix and
    # the last suffix splits, at suffix + separator + prefix, into n non-empty digit runs
    between, cut = joined[len(prefix):len(joined) - len(suffix)], f"{suffix}{_SEP}{prefix}"
    middles: Sequence[int] = range(n)
    if between != cut.join(_decimals(n)):  # (the usual stack: 0 .. n-1, in order)
        texts = between.split(cut)
        digits = "".join(texts)
        if len(texts) != n or not (all(texts) and digits.isascii() and digits.isdigit()) \
                or any(len(t) > 1 and t[0] == "0" for t in texts):
            return None
        middles = list(map(int, texts))
    numbers = list(map(int, _NUMBER.findall("." + first)))
    at = len(_NUMBER.findall("." + prefix[:-1])) if prefix else 0
    if at >= len(numbers) or numbers[at] != int(middle):
        return None  # (cannot happen: the middle is a numeric component of the first key)
    block = _Block(tuple(numbers[:at]), middles, tuple(numbers[at + 1:]))
    return _NUMBER.sub(".\0", "." + first), block


@functools.lru_cache(maxsize=16)
def _decimals(n: int) -> tuple[str, ...]:
    """``("0", "1", …, str(n - 1))``."""
    return tuple(map(str, range(n)))


def _block_product(blocks: list[_Block]) -> list[tuple[str, ...]] | None:
    """:func:`_product` of the blocks' rows, without making them; ``None``: not a product,
    or blocks that vary different columns."""
    middles: dict[tuple[tuple[int, ...], tuple[int, ...]], set[int]] = {}
    for b in blocks:
        middles.setdefault((b.before, b.after), set()).update(b.middles)
    if len({len(before) for before, _ in middles}) != 1:
        return None
    fixed = [set(c) for c in zip(*(before + after for before, after in middles), strict=True)]
    at = len(blocks[0].before)
    columns = [*fixed[:at], set().union(*middles.values()), *fixed[at:]]
    if sum(map(len, middles.values())) != math.prod(map(len, columns)):
        return None
    return [tuple(ranges(c) for c in columns)]


def _fold(by_shape: _Shapes, blocks: dict[str, list[_Block]]) -> list[str]:
    """Each shape's rows and blocks folded into its template, shapes by their first key."""
    folded = []
    for shape in sorted(by_shape, key=lambda s: natural_key(by_shape[s][0])):
        template = _template(shape[1:])
        rows, alike = by_shape[shape][1], blocks.get(shape, [])
        labels = _block_product(alike) if alike and not rows else None
        if labels is None:
            labels = _fold_unique(set(rows).union(*(b.rows() for b in alike)))
        for each in labels:
            it = iter(each)
            folded.append(".".join(p if p is not None else next(it) for p in template))
    return folded


_ALTERNATION = re.compile(r"\((?:[^()|]+\|){3,}[^()|]+\)")  # (a|b|c|d…): 4+ alternatives
_ESCAPED = re.compile(r"\\(.)")


def fold_alternations(text: str) -> str:
    """``text`` (a transform's description) with each regex alternation of 4+ literal
    names folded like keys: ``^(model\\.layers\\.0\\.mlp\\.down_proj|…)`` (every module a
    LoRA wraps, thousands of characters) → ``^(model.layers.{0..31}.mlp.down_proj|…)``.
    Alternatives that differ only in how many digits a ``\\d`` run matches (a renaming over
    layers 0-9 and 10-99) are one: ``model.layers.\\d{1,2}.mlp.down_proj``. An alternative
    that is another pattern, not an escaped literal, leaves its group as it is."""
    def fold(found: re.Match[str]) -> str:
        words = found.group(0)[1:-1].split("|")
        literal: list[str] = []
        runs: dict[tuple[str, ...], set[int]] = {}  # word shape → its \d run's lengths
        for word in words:
            parts = _DIGITS.split(word)
            plain = [_ESCAPED.sub(r"\1", p) for p in parts[::2]]
            if any(re.escape(x) != p for x, p in zip(plain, parts[::2], strict=True)):
                return found.group(0)
            if len(parts) == 1:
                literal.append(plain[0])
            elif len(parts) == 3:  # one run of \d: merged with its other lengths
                runs.setdefault(tuple(plain), set()).add(len(parts[1]) // 2)
            else:
                return found.group(0)
        shaped = [f"{a}{_run(sorted(n))}{b}" for (a, b), n in runs.items()]
        return "(" + "|".join([*fold_keys(literal), *shaped]) + ")"

    return _ALTERNATION.sub(fold, text)


_DIGITS = re.compile(r"((?:\\d)+)")


def _run(lengths: list[int]) -> str:
    """A run of ``\\d`` matching each of ``lengths`` digits (``\\d{1,2}``), when they are
    consecutive; else each length as an alternative."""
    if lengths == list(range(lengths[0], lengths[-1] + 1)):
        return "\\d" * lengths[0] if len(lengths) == 1 else f"\\d{{{lengths[0]},{lengths[-1]}}}"
    return "(" + "|".join("\\d" * n for n in lengths) + ")"
