"""Key patterns: regex sources with an index wildcard, literal targets with references.

Source patterns are regular expressions searched (``re.search``) in a checkpoint key. A
``*`` that stands for a whole key component (``experts.*.w1``: a dot, or the start, before
it and a dot after it) is the *index wildcard*: it matches one all-digit component and
its value orders the collected tensors numerically. Any other ``*`` is a regex quantifier
(``language_model.*`` keeps meaning "language_model followed by anything").

Target patterns are literal key fragments: ``\\1``, ``\\2``… insert the source's capturing
groups (the wildcard is not a group), ``*`` inserts an index, ``\\.`` is a dot, and a
leading ``^`` / trailing ``$`` are dropped. Other regex syntax in a target is an error:
a target must name exactly one key.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from weightplan.errors import PatternError

try:  # (the regex's own parse: required_literal)
    from re import _constants, _parser  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_constants as _constants
    import sre_parse as _parser

_WILDCARD = re.compile(r"(?:(?<=^)|(?<=\^)|(?<=\.)|(?<=\\\.))\*(?=\\?\.)")
_INDEX_GROUP = "_wp_index"
_TARGET_META = set("()[]{}?+|")


@dataclass(frozen=True, slots=True)
class PatternMatch:
    """Where a source pattern matched a key and what it captured."""

    start: int
    end: int
    index: int | None  # value of the index wildcard, if the pattern has one
    groups: tuple[str | None, ...]  # user capturing groups, in order (\1 is groups[0])


@dataclass(frozen=True, slots=True)
class SourcePattern:
    """A compiled source pattern; build with :func:`compile_source`."""

    text: str
    regex: re.Pattern
    has_index: bool
    user_groups: tuple[int, ...]  # regex group numbers of the user's groups, in order
    literal: str = ""  # text every match holds (:func:`required_literal`)

    def search(self, key: str) -> PatternMatch | None:
        m = self.regex.search(key)
        if m is None:
            return None
        index = int(m.group(_INDEX_GROUP)) if self.has_index else None
        return PatternMatch(m.start(), m.end(), index, tuple(m.group(g) for g in self.user_groups))


def compile_source(text: str) -> SourcePattern:
    """Compile ``text``; raises :class:`PatternError` naming the pattern when invalid."""
    if not isinstance(text, str) or not text:
        raise PatternError(f"a source pattern must be a non-empty string, got {text!r}")
    pieces = _WILDCARD.split(text)
    if len(pieces) > 2:
        raise PatternError(f"source pattern {text!r} has {len(pieces) - 1} index wildcards; "
                           r"use one `*` and capture other indices with (\d+)")
    body = f"(?P<{_INDEX_GROUP}>\\d+)".join(pieces)
    try:
        regex = re.compile(body)
    except re.error as e:
        raise PatternError(f"source pattern {text!r} is not a valid regex: {e}") from e
    index_group = regex.groupindex.get(_INDEX_GROUP)
    user = tuple(g for g in range(1, regex.groups + 1) if g != index_group)
    return SourcePattern(text, regex, index_group is not None, user, required_literal(regex))


def required_literal(regex: re.Pattern) -> str:
    """The longest run of literal characters in ``regex``'s top-level sequence: text that
    every match holds (``""``: none, or a case-insensitive regex). A key that doesn't hold
    it can't match, so a batch of keys whose joined text doesn't is skipped whole."""
    return _required_literal(regex.pattern, regex.flags)


@functools.lru_cache(maxsize=4096)  # (a mapping's transforms are made again for every plan)
def _required_literal(pattern: str, flags: int) -> str:
    if flags & re.IGNORECASE:
        return ""
    best = run = ""
    for op, arg in _parser.parse(pattern, flags):
        if op == _constants.LITERAL:
            run += chr(arg)
            continue
        best, run = best if len(best) >= len(run) else run, ""
    return best if len(best) >= len(run) else run


@dataclass(frozen=True, slots=True)
class TargetPattern:
    """A literal key fragment with group references; build with :func:`compile_target`."""

    text: str
    parts: tuple[str | int, ...]  # literal text, group number (1-based), or 0 for `*`

    @property
    def max_group(self) -> int:
        return max((p for p in self.parts if isinstance(p, int)), default=0)

    @property
    def has_index(self) -> bool:
        return 0 in self.parts

    def expand(self, groups: tuple[str | None, ...] = (), index: int | str | None = None) -> str:
        """Fill in group references and the index (``index="*"`` keeps the star)."""
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            elif part == 0:
                if index is None:
                    raise PatternError(f"target {self.text!r} has `*` but no index to fill")
                out.append(str(index))
            else:
                captured = groups[part - 1] if part <= len(groups) else None
                if captured is None:
                    raise PatternError(f"target {self.text!r} uses \\{part} but the source "
                                       f"captured only {len(groups)} group(s)")
                out.append(captured)
        return "".join(out)


def compile_target(text: str) -> TargetPattern:
    """Parse a target pattern; raises :class:`PatternError` for regex syntax."""
    if not isinstance(text, str):
        raise PatternError(f"a target pattern must be a string, got {text!r}")
    body = text[1:] if text.startswith("^") else text
    body = body[:-1] if body.endswith("$") and not body.endswith("\\$") else body
    parts: list[str | int] = []
    literal: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            j = i + 1
            while j < len(body) and body[j].isdigit():
                j += 1
            if j > i + 1:
                parts.extend(["".join(literal), int(body[i + 1:j])])
                literal, i = [], j
                continue
            literal.append(body[i + 1])
            i += 2
            continue
        if c == "*":
            parts.extend(["".join(literal), 0])
            literal = []
        elif c in _TARGET_META:
            raise PatternError(f"target pattern {text!r} contains regex syntax {c!r}; a "
                               r"target is a literal key fragment (use \1 for groups)")
        else:
            literal.append(c)
        i += 1
    parts.append("".join(literal))
    return TargetPattern(text, tuple(p for p in parts if p != ""))


def source_to_target(text: str) -> str:
    """Turn a source regex into the target that writes the key it matched (for inverses).

    Capturing groups become ``\\1``, ``\\2``…; lookarounds, ``^`` and ``$`` are dropped;
    ``\\.`` becomes ``.``. Raises :class:`NotInvertibleError` when what is left is not a
    literal (``.*``, ``[ab]``, ``\\d``, alternation): the inverse would be a guess.
    """
    from weightplan.errors import NotInvertibleError

    out: list[str] = []
    i, count = 0, 0
    body = text[1:] if text.startswith("^") else text
    body = body[:-1] if body.endswith("$") and not body.endswith("\\$") else body
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            if body[i + 1].isalnum():
                raise NotInvertibleError(f"pattern {text!r}: \\{body[i + 1]} is not a literal")
            out.append("\\" + body[i + 1] if body[i + 1] in "\\*" else body[i + 1])
            i += 2
        elif c == "(":
            end = _closing_paren(body, i)
            inner = body[i + 1:end]
            if inner.startswith(("?=", "?!", "?<=", "?<!")):
                pass  # lookarounds only restrict where the source matched
            elif inner.startswith("?") and not inner.startswith("?P<"):
                raise NotInvertibleError(f"pattern {text!r}: group ({inner}) is not invertible")
            else:
                count += 1
                out.append(f"\\{count}")
            i = end + 1
        elif c == "*" and _WILDCARD.match(body, i) is not None:
            out.append("*")
            i += 1
        elif c in "[]{}?+|*":
            raise NotInvertibleError(f"pattern {text!r} is not a literal key fragment ({c!r})")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def target_to_source(target: TargetPattern, source: SourcePattern) -> str:
    """Turn a target back into a source regex; ``\\N`` becomes the source's N-th group."""
    pieces = []
    for part in target.parts:
        if isinstance(part, str):
            pieces.append(re.escape(part))
        elif part == 0:
            pieces.append("*")
        else:
            pieces.append("(" + group_text(source.text, part) + ")")
    return "".join(pieces)


def group_text(text: str, n: int) -> str:
    """The regex text inside the n-th capturing group of ``text``."""
    count, i = 0, 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "(":
            end = _closing_paren(text, i)
            inner = text[i + 1:end]
            if not inner.startswith("?") or inner.startswith("?P<"):
                count += 1
                if count == n:
                    return inner.split(">", 1)[1] if inner.startswith("?P<") else inner
        i += 1
    raise PatternError(f"pattern {text!r} has no capturing group {n}")


def _closing_paren(text: str, start: int) -> int:
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = text.index("]", i + 2 if text[i + 1:i + 2] == "]" else i + 1) + 1
            continue
        depth += c == "("
        depth -= c == ")"
        if depth == 0:
            return i
        i += 1
    raise PatternError(f"unbalanced parentheses in {text!r}")


def natural_key(key: str) -> tuple:
    """Sort key: dot components, digits compared as numbers (``experts.10`` after ``.9``)."""
    return tuple(map(_component_key, key.split(".")))


@functools.lru_cache(maxsize=1 << 16)
def _component_key(part: str) -> tuple:
    return (0, int(part), "") if part.isdigit() else (1, 0, part)
