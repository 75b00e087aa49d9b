"""The safetensors format rules, enforced as safetensors' own reader enforces them.

A header is accepted only when safetensors would accept it, and a few things it leaves to
luck are refused too:

- the header is UTF-8 JSON, an object, at most :data:`MAX_HEADER_BYTES`, nested at most
  :data:`MAX_DEPTH` deep, without ``NaN``/``Infinity`` and without duplicate keys at any
  level (``json`` would keep the last one silently: a second entry for a key could alias
  another tensor's bytes);
- ``__metadata__`` is ``null`` or an object of strings;
- every entry has a known ``dtype`` (a string), a ``shape`` of non-negative integers
  (booleans are not integers here) whose product fits in 63 bits, and ``data_offsets``
  ``[begin, end]`` spanning exactly ``numel * itemsize`` bytes;
- sorted by offsets, the entries cover the data exactly: the first begins at 0, each
  begins where the previous ended (no gap, no overlap), and the last ends at the end of
  the file (no trailing bytes).

Every violation is a :class:`HeaderError` (or :class:`TruncatedCheckpointError`) naming
the file and, where there is one, the key.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection
from operator import itemgetter

from weightplan.errors import HeaderError, NotSafetensorsError, TruncatedCheckpointError

MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 64
MAX_DIM = 2**63 - 1  # torch sizes are int64

_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_EMPTY_PAIRS = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_SYNTAX = bytes(b for b in range(256) if b not in b'[]{}"\\')


def json_depth_ok(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON text ``raw`` nests at most ``limit`` deep (strings skipped).

    Each pass deletes the innermost ``[]``/``{}`` pairs, so ``limit`` passes empty any
    text nested at most ``limit`` deep; every pass runs at C speed.
    """
    syntax = raw.translate(None, _NOT_SYNTAX)  # strings keep only their quotes / escapes
    brackets = _STRINGS.sub(b"", syntax).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return True
        shorter = _EMPTY_PAIRS.sub(b"", brackets)
        if shorter == brackets:
            return True  # unbalanced: json.loads will say where
        brackets = shorter
    return not brackets


def _no_duplicates(where: Callable[[str], HeaderError]
                   ) -> Callable[[list[tuple[str, object]]], dict[str, object]]:
    def hook(pairs: list[tuple[str, object]]) -> dict:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise where(key)
                seen.add(key)
        return out

    return hook


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def loads_plain(raw: bytes) -> object:
    """``raw`` as UTF-8 JSON parsed by plain ``json.loads`` (C speed), or ``None`` when that
    fails. Not strict on its own: a caller accepts the value only after :func:`no_duplicates`
    and its own checks of the structure (depth, no non-finite floats), and otherwise takes
    the strict path, which says exactly what is wrong."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def no_duplicates(raw: bytes, pairs: int) -> bool:
    """Whether the JSON text ``raw``, parsed into objects holding ``pairs`` key/value pairs in
    all, had no duplicate key (a proof, not a guess; ``False`` may still mean none).

    Every pair of the text, a dropped duplicate and the pairs inside its value included, has
    one ``:`` outside strings, and strings may hold more (escaped, ``\\u003a``, they count
    nowhere). So ``raw.count(b":") >= pairs in the text >= pairs``, and equality leaves no
    room for a dropped pair."""
    return raw.count(b":") == pairs


def _plain_pairs(value: object, depth: int = 1) -> int | None:
    """The pairs of all objects in ``value``; ``None`` when it nests deeper than
    :data:`MAX_DEPTH` (``value`` itself at ``depth``) or holds a non-finite float."""
    items: Collection[object]
    if type(value) is dict:
        items, count = value.values(), len(value)
    elif type(value) is list:
        items, count = value, 0
    else:
        return None if type(value) is float and not math.isfinite(value) else 0
    if depth > MAX_DEPTH:
        return None
    kinds = set(map(type, items))
    if float in kinds and not all(math.isfinite(v) for v in items if type(v) is float):
        return None
    if dict in kinds or list in kinds:
        for item in items:
            if type(item) is dict or type(item) is list:
                inner = _plain_pairs(item, depth + 1)
                if inner is None:
                    return None
                count += inner
    return count


def strict_json(raw: bytes, *, file: str, what: str = "header") -> object:
    """Parse ``raw`` as strict JSON: UTF-8, bounded depth, no duplicate keys, no NaN.

    The common case is plain ``json.loads`` plus one walk of the value; whatever that can't
    vouch for is parsed again strictly, which raises the precise error."""
    value = loads_plain(raw)
    if value is not None:
        pairs = _plain_pairs(value)
        if pairs is not None and no_duplicates(raw, pairs):
            return value
    return _strict_json(raw, file=file, what=what)


def _strict_json(raw: bytes, *, file: str, what: str) -> object:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HeaderError(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start})",
                          file=file) from e
    if not json_depth_ok(raw):
        raise HeaderError(f"{what} JSON is nested deeper than {MAX_DEPTH} levels", file=file)

    def duplicate(key: str) -> HeaderError:
        return HeaderError(f"the {what} has this key twice (a reader would silently keep "
                           "one of them); the file is corrupt or crafted", file=file, key=key)

    try:
        return json.loads(text, object_pairs_hook=_no_duplicates(duplicate),
                          parse_constant=_refuse_constant)
    except HeaderError:
        raise
    except RecursionError as e:
        raise HeaderError(f"{what} JSON is nested too deeply", file=file) from e
    except ValueError as e:
        raise HeaderError(f"{what} is not valid JSON: {e}", file=file) from e


def parse_header(path: str, raw: bytes) -> dict:
    """The header object of a safetensors file (``raw``: the bytes after the length)."""
    if raw.lstrip(b" \t\r\n")[:1] != b"{":
        raise NotSafetensorsError("header is not a JSON object", file=path)
    header = strict_json(raw, file=path)
    if not isinstance(header, dict):
        raise HeaderError("header is not a JSON object", file=path)
    return header


def parse_metadata(path: str, value: object) -> dict[str, str]:
    """``__metadata__``: absent/``null`` or an object whose values are all strings."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise HeaderError("__metadata__ is not an object of strings", file=path)
    for key, item in value.items():
        if not isinstance(item, str):
            raise HeaderError(f"__metadata__ value is a {type(item).__name__}, not a string",
                              file=path, key=f"__metadata__.{key}")
    return dict(value)


def _is_int(value: object, limit: int) -> bool:
    return type(value) is int and 0 <= value <= limit


def check_shape(path: str, key: str, shape: object) -> tuple[int, ...]:
    """Non-negative integer dims (not booleans) whose running product fits in 63 bits."""
    if not isinstance(shape, list) or not all(_is_int(d, MAX_DIM) for d in shape):
        raise HeaderError(f"invalid shape {shape!r}: dims must be non-negative integers",
                          file=path, key=key)
    product = 1
    for d in shape:
        product *= d
        if product > MAX_DIM:
            raise HeaderError(f"shape {shape!r} has more elements than fit in 63 bits",
                              file=path, key=key)
    return tuple(shape)


def check_offsets(path: str, key: str, offsets: object) -> tuple[int, int]:
    """``[begin, end]``: two integers (not booleans), ``begin <= end``."""
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(_is_int(o, 2**64 - 1) for o in offsets) and offsets[0] <= offsets[1]):
        raise HeaderError(f"invalid data_offsets {offsets!r}: want [begin, end] with "
                          "0 <= begin <= end", file=path, key=key)
    return offsets[0], offsets[1]


def check_coverage(path: str, spans: dict[str, tuple[int, int]], data_bytes: int) -> None:
    """The spans, sorted, tile ``[0, data_bytes)`` exactly: no gap, overlap or trailing byte."""
    start, last = 0, None
    for key, (begin, end) in sorted(spans.items(), key=itemgetter(1)):
        if begin != start:
            what = "overlaps" if begin < start else "leaves a gap after"
            prev = f"the previous tensor {last!r}" if last is not None else "the data start"
            raise HeaderError(f"data_offsets [{begin}, {end}] {what} {prev} (which ends at "
                              f"{start}); tensors must cover the data exactly, in order",
                              file=path, key=key)
        start, last = end, key
    if start > data_bytes:
        raise TruncatedCheckpointError(
            f"the header's tensors need {start} data bytes but the file has {data_bytes} "
            "after the header", file=path, key=last)
    if start < data_bytes:
        raise HeaderError(f"{data_bytes - start} trailing bytes after the last tensor "
                          f"{last!r}; safetensors refuses such files", file=path)
