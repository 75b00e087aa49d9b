"""Key templates: route ``layers.7.experts.42.w1`` once for every layer and expert.

A frontier checkpoint has ~92k keys but a few dozen distinct shapes of key once layer and
expert numbers are abstracted. The *template* of a key makes ``1`` every ASCII digit of
its all-digit components (``layers.12.experts.3.w1`` → ``layers.11.experts.1.w1``: the
digits inside a name such as ``w1`` or ``fc2`` are kept; lengths and positions of digits
are kept, and ``int`` round-trips them because a run of ``1``\\ s has no leading zero).
A transform is *digit-blind* when nothing in it can tell the digits of an all-digit
component apart: its scope and prefixes hold no ASCII digit, and in its source regexes
every ASCII digit follows an unescaped ASCII letter or ``_`` (``w1``, ``fc12``: a
literal in a name; ``\\d`` is fine; ``{2}``, ``[0-5]``, ``\\1`` back-references and a
lone ``1`` are not). Digit-blind regexes match a key and its template at the same spans
as long as every run of digits the keys differ in follows a dot or the start: so it is
in a template; renamings may move such digits (``layers.3`` → ``layer3``), so where a
list holds a literal digit its renamings are followed on two probes of the template
(its abstracted digits ``1`` and ``2``: where they differ the keys may, see
:func:`apart`). Which transforms *match* is decided once per template; whether a
matching renaming really changes the key, and what it captures, is still computed on
the real key.

:func:`templates_of` computes every key's template in passes over the keys' joined text,
and :func:`natural_order` sorts keys as :func:`~.patterns.natural_key` does from a string
per key that a template turns out cheaply (see :func:`sort_texts`), or, for keys that
share no template, the keys' joined text (:func:`joined_sort_texts`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter, methodcaller

from weightplan.planner.keys.patterns import _INDEX_GROUP, natural_key
from weightplan.planner.keys.transforms import (
    PrefixChange, WeightConverter, WeightRenaming,
    WeightTransform,
)

_TO_ONE = str.maketrans("0123456789", "1111111111")
_LEADING_ZERO = re.compile(r"(?<![0-9])0[0-9]")
_DIGIT = re.compile(r"[0-9]")
_COMPONENT_NUMBER = re.compile(r"(?<![^.])[0-9]+(?![^.])")
_BYTES_TO_ONE = bytes.maketrans(b"0123456789", b"1111111111")
# _LEADING_ZERO on bytes, led by its literal "0" (rare in keys): the search skips to each
_BYTES_LEADING_ZERO = re.compile(rb"0(?<![0-9]0)[0-9]")
# every digit made 1: a component holding a 1 and another character (``w1``)
_BYTES_NAMED = re.compile(rb"1(?:[^.\n1]|(?<=[^.\n1]1))")
# in keys each led by a dot and ended by a newline: an all-digit component with its dot
# (led by a literal: the regex engine skips from dot to dot)
_BYTES_NUMBERS = re.compile(rb"(\.[0-9]+)(?=[.\n])")
_NUMBERS = re.compile(r"(\.[0-9]+)(?=[.\n])")


def template_of(key: str) -> str | None:
    """The key with every digit of its all-digit components made ``1``; ``None`` when a
    number has a leading zero (``experts.007``), whose value would not round-trip."""
    if _LEADING_ZERO.search(key) is not None:
        return None
    return _COMPONENT_NUMBER.sub(_ones, key)


def _ones(m: re.Match) -> str:
    return "1" * (m.end() - m.start())


def coarse(key: str) -> str:
    """The key with every ASCII digit made ``1`` (what keys of a template may land on)."""
    return key.translate(_TO_ONE)


def templates_of(keys: Sequence[str]) -> list[str | None]:
    """:func:`template_of` of every key, in bulk: one translation of the joined keys (ASCII
    digits never occur inside a UTF-8 multi-byte sequence) making every digit ``1``, which
    is every key's template where no component mixes digits with other characters (``w1``);
    where one does, the all-digit components are found in the joined keys by one regex
    split instead (:data:`_BYTES_NUMBERS`) and only they are made ``1``\\ s. ``None`` for
    each key holding a leading zero. Key by key where a key holds a newline."""
    text = "\n".join(keys).encode("utf-8", "surrogatepass")
    ones = text.translate(_BYTES_TO_ONE)
    if _BYTES_NAMED.search(ones) is not None:  # (every key led by a dot, ended by a newline)
        pieces = _BYTES_NUMBERS.split(b"." + text.replace(b"\n", b"\n.") + b"\n")
        pieces[1::2] = map(methodcaller("translate", _BYTES_TO_ONE), pieces[1::2])
        ones = b"".join(pieces)[1:-1].replace(b"\n.", b"\n")
    templates: list[str | None] = []
    templates += ones.decode("utf-8", "surrogatepass").split("\n")
    if len(templates) != len(keys):  # a key holds a newline (or there is none)
        return [template_of(k) for k in keys]
    index = last = 0
    for found in _BYTES_LEADING_ZERO.finditer(text):  # (the key it is in: newlines before it)
        index += text.count(b"\n", last, found.start())
        last = found.start()
        templates[index] = None
    return templates


def natural_order(batches: Sequence[tuple[str | None, Sequence[str]]]) -> list[int]:
    """The keys of ``batches`` (each a template and its keys, ``None`` for keys that share
    none; the keys taken one batch after another) in natural key order
    (:func:`~.patterns.natural_key`, ties kept in that order): their positions, sorted.
    Sorted by a string per key, made per template where the keys share one
    (:func:`sort_texts`), else from the keys' joined text (:func:`joined_sort_texts`),
    where the keys are ASCII without a newline or a character below ``\\x03``; else by
    ``natural_key`` itself."""
    keys: list[str] = []
    for _, members in batches:
        keys += members
    text = "".join(keys)
    if text.isascii() and not any(c in text for c in "\x00\x01\x02\n"):
        texts: list[str] = []
        for template, members in batches:
            texts += joined_sort_texts(members) if template is None else \
                sort_texts(template, members)
        return sorted(range(len(keys)), key=texts.__getitem__)
    natural = list(map(natural_key, keys))
    return sorted(range(len(keys)), key=natural.__getitem__)


def joined_sort_texts(keys: Sequence[str]) -> list[str]:
    """:func:`sort_texts` of ``keys`` (ASCII, no newline nor character below ``\\x03``; any
    templates, leading zeros too) from their joined text: its all-digit components found
    by one regex split (:data:`_NUMBERS`; a key's lead becomes ``\\x00``), each encoded
    (leading zeros dropped: the value's digits), the dots between the rest made
    ``\\x00\\x02``. No step is per key."""
    if not keys:
        return []
    pieces = _NUMBERS.split("." + "\n.".join(keys) + "\n")
    digits = list(map(itemgetter(slice(1, None)), pieces[1::2]))
    if "0" in "".join(map(itemgetter(0), digits)):
        digits = [d.lstrip("0") or "0" for d in digits]
    lengths = list(map(len, digits))
    heads = [f"\x00\x01{chr(48 + n)}" for n in range(max(lengths, default=0) + 1)]
    pieces[1::2] = map(str.__add__, map(heads.__getitem__, lengths), digits)
    texts = "".join(pieces).replace(".", "\x00\x02").split("\n")
    texts.pop()  # (after the last newline: nothing)
    return texts


def sort_texts(template: str, keys: Sequence[str]) -> list[str]:
    """For each of ``keys`` (all of ``template``: ASCII, no leading zeros, no character
    below ``\\x03``), a string whose order is :func:`~.patterns.natural_key`'s. Components
    are each led by ``\\x00`` (a shorter key sorts first); a number is ``\\x01``, its length,
    its digits; any other component ``\\x02`` and its text. Which components hold digits,
    and how many, is the template's: a key gives only their text, sliced out in C-level
    passes and joined with the template's fixed pieces."""
    pieces, spans = _sort_pieces(template)
    if not spans:
        return [pieces[0]] * len(keys)
    columns: list[Iterable[str]] = [repeat(pieces[0])]
    for span, piece in zip(spans, pieces[1:], strict=True):
        columns += [map(itemgetter(span), keys), repeat(piece)]
    return list(map("".join, zip(*columns, strict=False)))  # repeat() never ends


@functools.lru_cache(maxsize=1024)
def _sort_pieces(template: str) -> tuple[tuple[str, ...], tuple[slice, ...]]:
    pieces, spans, text, at = [], [], [], 0
    for part in template.split("."):
        if "1" not in part:
            text.append("\x02" + part)
        else:
            text.append(f"\x01{chr(48 + len(part))}" if part.isdigit() else "\x02")
            pieces.append("\x00".join(text))
            text = [""]  # the next component's separator follows the digits
            spans.append(slice(at, at + len(part)))  # a key's digits sit where its template's do
        at += len(part) + 1
    pieces.append("\x00".join(text))
    pieces[0] = "\x00" + pieces[0]  # (the first component's lead, as joined_sort_texts')
    return tuple(pieces), tuple(spans)


def _no_digit(text: str | None) -> bool:
    return text is None or _DIGIT.search(text) is None


def digit_blind(transform: WeightTransform) -> bool:
    """True when ``transform`` treats alike every digit of an all-digit component (see
    the module docstring)."""
    if not (_no_digit(transform.scope_prefix) and _no_digit(getattr(transform, "outside", None))):
        return False
    if isinstance(transform, PrefixChange):
        return all(_no_digit(t) for t in (transform.prefix_to_add, transform.prefix_to_remove,
                                          transform.model_prefix))
    if not isinstance(transform, (WeightRenaming, WeightConverter)):
        return False
    return all(_named_digits_only(s.regex.pattern) for s in transform.sources)


def _named_digits_only(pattern: str) -> bool:
    """Whether every ASCII digit of ``pattern`` is a literal following an unescaped ASCII
    letter or ``_`` (through other such digits), outside a character class; and no named
    back-reference (it would compare captured digits)."""
    if "(?P=" in pattern:
        return False
    named, i, count = False, 0, len(pattern)
    while i < count:
        c = pattern[i]
        if c == "\\":  # an escape: a back-reference, a code (\x31, \N{...}) or a class
            if pattern[i + 1:i + 2] in ("N", *"0123456789"):
                return False
            named, i = False, i + 2
        elif c == "[":  # a class: no digit up to its closing bracket
            j = i + 1 + (pattern[i + 1:i + 2] == "^")
            j += pattern[j:j + 1] == "]"  # (a leading bracket is a literal)
            while j < count and pattern[j] != "]":
                if pattern[j] in "0123456789" or (
                        pattern[j] == "\\" and pattern[j + 1:j + 2] in ("N", *"0123456789")):
                    return False
                j += 2 if pattern[j] == "\\" else 1
            named, i = False, j + 1
        elif c in "0123456789":
            if not named:
                return False
            i += 1
        else:
            named, i = c.isascii() and (c.isalpha() or c == "_"), i + 1
    return True


def digit_free(transform: WeightTransform) -> bool:
    """Whether ``transform`` holds no ASCII digit at all: then no renaming before it can
    move digits where it tells them apart (see :func:`apart`)."""
    if isinstance(transform, PrefixChange):
        return True  # (digit-blind ones hold none)
    if not isinstance(transform, (WeightRenaming, WeightConverter)):
        return False  # (a renaming of the user's own: it may hold any)
    return all(_no_digit(s.regex.pattern) for s in transform.sources)


def all_blind(transforms: Iterable[WeightTransform]) -> bool:
    return all(digit_blind(t) for t in transforms)


def probe(template: str) -> str:
    """``template`` with the digits of its all-digit components made ``2``: where this
    and the template differ after the same renamings, the keys of the template may."""
    return _COMPONENT_NUMBER.sub(_twos, template)


def _twos(m: re.Match) -> str:
    return "2" * (m.end() - m.start())


def apart(ones: str, twos: str) -> bool:
    """Whether a digit-blind regex may tell apart keys that read ``ones`` and ``twos``
    (the template and :func:`probe` after the same renamings): where they differ in
    length, or a run of digits they differ in doesn't follow a dot or the start (a
    literal digit of the regex after a letter could reach it)."""
    if len(ones) != len(twos):
        return True
    for i, (one, two) in enumerate(zip(ones, twos, strict=True)):
        if one != two:
            j = i
            while j and ones[j - 1] in "0123456789":
                j -= 1
            if j and ones[j - 1] != ".":
                return True
    return False


@dataclass(frozen=True, slots=True)
class Moves:
    """Where the numbers (all-digit components) of a template's keys sit in the name its
    renamings make, while each renaming that matches replaces and captures text holding
    none of them: a digit-blind regex matches every key of the template at the template's
    spans, so its replacement is the same for every key, and each key's name is the
    template's name with the key's own numbers put back (:meth:`names`, in C-level
    passes) instead of the renamings replayed key by key."""

    spans: tuple[tuple[int, int], ...]  # each number's span in the keys
    at: tuple[int, ...]  # where each starts in the name the renamings made so far
    pieces: tuple[str, ...] = ()  # the final name's text around the numbers (see :meth:`to`)

    @classmethod
    def of(cls, template: str) -> "Moves":
        spans = tuple(m.span() for m in _COMPONENT_NUMBER.finditer(template))
        return cls(spans, tuple(a for a, _ in spans))

    def spliced(self, renaming: WeightTransform, name: str) -> "Moves | None":
        """The moves after ``renaming`` (which matches ``name``, the template renamed so
        far) renames it; ``None`` where its match or a group (the index included) holds
        a number, or it is no :class:`WeightRenaming` (a prefix change)."""
        if not isinstance(renaming, WeightRenaming):
            return None
        found = renaming.first_match(name)
        if found is None:
            return None
        i, head, rest, _ = found
        m = renaming.sources[i].regex.search(rest)
        assert m is not None, name  # first_match found it in ``rest``
        base = len(head)
        start, end = base + m.start(), base + m.end()
        spans = [(start, end), *((base + m.start(g), base + m.end(g))
                                 for g in range(1, m.re.groups + 1) if m.start(g) >= 0)]
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        for a, (first, last) in zip(self.at, self.spans, strict=True):
            if a < hi and a + last - first > lo:
                return None  # (a number in the text it replaces or takes)
        new = renaming.rename(name)
        delta = 0 if new is None else len(new) - len(name)
        return Moves(self.spans, tuple(a if a < start else a + delta for a in self.at))

    def to(self, name: str) -> "Moves":
        """These moves with the final ``name``'s text around the numbers."""
        pieces, last = [], 0
        for a, (first, end) in zip(self.at, self.spans, strict=True):
            pieces.append(name[last:a])
            last = a + end - first
        pieces.append(name[last:])
        return Moves(self.spans, self.at, tuple(pieces))

    def names(self, keys: Sequence[str]) -> list[str]:
        """The final name of each of ``keys`` (all of the template)."""
        if not self.spans:
            return list(repeat(self.pieces[0], len(keys)))
        columns: list[Iterable[str]] = [repeat(self.pieces[0])]
        for span, piece in zip(self.spans, self.pieces[1:], strict=True):
            columns += [map(itemgetter(slice(*span)), keys), repeat(piece)]
        return list(map("".join, zip(*columns, strict=False)))  # repeat() never ends


@dataclass(frozen=True, slots=True)
class MatchShape:
    """Where a converter's source matched a template: spans (absolute in the key) that
    are the same in every key of the template, so the real match is rebuilt by slicing."""

    source_index: int
    scope: int  # length of the scope head the source was searched after
    start: int
    end: int
    index_span: tuple[int, int] | None
    group_spans: tuple[tuple[int, int] | None, ...]

    @classmethod
    def of(cls, converter: WeightConverter, name: str) -> "MatchShape | None":
        found = converter.first_match(name)
        if found is None:
            return None
        i, head, rest, _ = found
        source = converter.sources[i]
        m = source.regex.search(rest)
        assert m is not None, name  # first_match found it in ``rest``
        base = len(head)
        index = m.span(_INDEX_GROUP) if source.has_index else None
        groups = tuple(None if m.span(g)[0] < 0 else (base + m.start(g), base + m.end(g))
                       for g in source.user_groups)
        return cls(i, base, base + m.start(), base + m.end(),
                   None if index is None else (base + index[0], base + index[1]), groups)

    def only_index(self, template: str) -> bool:
        """Whether the keys of ``template`` differ inside the match only in the index."""
        if self.index_span is None:
            return False
        inside = template[self.start:self.index_span[0]] + template[self.index_span[1]:self.end]
        return "1" not in inside
