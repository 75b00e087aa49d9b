"""A safetensors header read in bulk: the common cases, checked column by column at C speed.

:func:`fast_entries` accepts a header only when the strict reader
(:func:`~weightplan.planner.inputs.checkpoint.read_stamped_header`'s entry-by-entry path)
would accept it with the same entries and metadata; for anything else it returns ``None``
and the caller takes the strict path, which raises the precise error (or accepts a rarity
these paths don't vouch for, such as a ``:`` inside a key). Two tiers:

1. **Compact text** (safetensors' own writer, weightplan's): one regular-expression split
   cuts the text into entries ``"key":{"dtype":"D","shape":[dims],"data_offsets":[b,e]}``
   (no escape or control character anywhere, offsets as canonical integers)
   and what lies between them, which must be exactly ``{``, an optional
   ``"__metadata__":{...},``, single commas and ``}``. The text is then, byte for byte,
   JSON whose meaning is the columns, without building a dict per entry. Writers lay the
   entries out in offset order, each ``begin`` the previous ``end``: the first split tried
   (:data:`_CHAINED`) matches from one entry's ``end`` to the next one's ``begin`` and
   requires, by a back-reference, that both are the same text, so each offset is captured
   once and the matches must follow each other with nothing between them. Any other
   order takes the second split (:data:`_COMPACT`), whose offsets are compared as text
   where they chain.
2. **Any JSON layout** (spaces, another order): plain ``json.loads``, then each rule
   checked over whole columns (``map``, ``set``, ``zip``, list comparisons): every entry
   an object of exactly ``dtype``, ``shape`` and ``data_offsets``; offsets integers
   spanning the tensor exactly; ``__metadata__`` absent, ``null`` or strings. That bounds
   the nesting (3 levels) and rules out NaN, and
   :func:`~weightplan.planner.inputs.safetensors_format.no_duplicates` proves no key was
   given twice.

Both check each distinct (dtype, shape) once, the strict path's way, and that the spans,
in header order (how writers lay them out) or else sorted, tile the data from 0 to the end
of the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import chain, repeat
from operator import itemgetter, sub
from typing import Any, cast

from weightplan.planner.core.entry import TensorEntry, build_entries
from weightplan.planner.inputs.safetensors_format import no_duplicates
from weightplan.planner.core.spec import SAFETENSORS_DTYPES, TensorSpec

__all__ = ["Columns", "SpecCache", "fast_columns", "fast_entries"]

# (dtype name, shape), or the compact text of both, → (spec, nbytes); one per checkpoint,
# so its files share one spec object per dtype and shape
SpecCache = dict[object, tuple[TensorSpec, int]]
Parsed = tuple[dict[str, TensorEntry], dict[str, str]]
Columns = tuple[list[str], list[TensorEntry], dict[str, str]]  # keys, entries, metadata
# keys, (spec, nbytes), begins (relative to the data) and metadata of a compact header
Compact = tuple[list[str], list[tuple[TensorSpec, int]], list[int], dict[str, str]]

# Keys and dtypes are ``[^"]*``: the header holds no backslash (no escapes) and no control
# character (JSON refuses them raw), checked once over the bytes, which is cheaper than
# excluding them in the pattern; a string's text is then its value.
_COMPACT = re.compile(r'"([^"]*)":\{("dtype":"[^"]*","shape":\[[0-9,]*\]),'
                      r'"data_offsets":\[(0|[1-9][0-9]*),(0|[1-9][0-9]*)\]\}')
# An entry's ``,end``, the next entry, and its ``begin`` (``\1``: the same text as that
# end). It starts with a literal comma, so a run of digits is tried once, not from each
# of its digits (which takes time quadratic in its length)
_CHAINED = re.compile(r',(0|[1-9][0-9]*)\]\},"([^"]*)":\{("dtype":"[^"]*","shape":\[[0-9,]*\]),'
                      r'"data_offsets":\[\1')
# What precedes the first _CHAINED match: ``{``, the metadata, the first entry up to its 0
_FIRST = re.compile(r'(.*)"([^"]*)":\{("dtype":"[^"]*","shape":\[[0-9,]*\]),"data_offsets":\[0',
                    re.DOTALL)
_NOT_PLAIN = bytes(range(32)) + b"\\"  # offsets: canonical integers, int() of the text
_GROUPS = 5  # what a _COMPACT split yields per entry: the text before it, then its 4 groups
_LINKS = 4  # what a _CHAINED split yields per match: the text before it, then its 3 groups
_WHITESPACE = " \t\n\r"  # JSON's
_FIELDS = itemgetter("dtype", "shape", "data_offsets")
_FAST_DIM = 1 << 31  # larger dims take the strict path's exact checks (u64, 63-bit products)


def fast_entries(path: str, raw: bytes, data_start: int, size: int, specs: SpecCache
                 ) -> Parsed | None:
    """The header ``raw`` of the file ``path`` as entries and ``__metadata__``, or ``None``
    when neither tier vouches for it (see the module docstring)."""
    columns = fast_columns(path, raw, data_start, size, specs)
    if columns is None:
        return None
    keys, made, meta = columns
    entries = dict(zip(keys, made, strict=True))
    if len(entries) == len(keys) and "__metadata__" not in entries:  # no key twice
        return entries, meta
    return None


def fast_columns(path: str, raw: bytes, data_start: int, size: int, specs: SpecCache
                 ) -> Columns | None:
    """:func:`fast_entries` as columns (keys, entries, ``__metadata__``), all but one
    check made: the caller proves that no key is given twice and none is
    ``"__metadata__"`` (both hold when a dict of the keys has one per key and lacks that
    one), or else takes the strict path."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    data_bytes = size - data_start
    if len(raw.translate(None, _NOT_PLAIN)) != len(raw):
        return _json_columns_of(path, text, raw, data_start, data_bytes, specs)
    compact = (_chained_columns(text, specs, data_bytes)
               or _compact_columns(text, specs, data_bytes))
    if compact is None:
        return _json_columns_of(path, text, raw, data_start, data_bytes, specs)
    keys, found, begins, meta = compact
    return keys, _entries(path, keys, found, begins, data_start), meta


def _entries(path: str, keys: list[str], found: list[tuple[TensorSpec, int]],
             begins: list[int], data_start: int) -> list[TensorEntry]:
    offsets = map(data_start.__add__, begins)
    return build_entries(keys, map(itemgetter(0), found), path, offsets)


def _chained_columns(text: str, specs: SpecCache, data_bytes: int) -> Compact | None:
    """:func:`_compact_columns` for entries laid out in offset order (one ``begin`` per
    entry captured, the text of each ``end`` being the next ``begin``)."""
    parts = _CHAINED.split(text)
    links = len(parts) // _LINKS  # entries after the first
    if (links < 1 or parts[_LINKS:-1:_LINKS].count("") != links - 1
            or parts[-1].rstrip(_WHITESPACE) != f",{data_bytes}]}}}}"):
        return None
    first = _FIRST.fullmatch(parts[0])
    if first is None:
        return None
    meta = _compact_metadata(first[1].lstrip(_WHITESPACE))
    idents = parts[3::_LINKS]
    idents.insert(0, first[3])
    found = _known(idents, specs, _compact_spec)
    if meta is None or found is None:
        return None
    starts = [0, *map(int, parts[1::_LINKS])]
    if list(map(sub, [*starts[1:], data_bytes], starts)) != list(map(itemgetter(1), found)):
        return None
    keys = parts[2::_LINKS]
    keys.insert(0, first[2])
    return keys, found, starts, meta


def _compact_columns(text: str, specs: SpecCache, data_bytes: int) -> Compact | None:
    """Keys, (spec, nbytes), begins and metadata of a compact header that tiles the data."""
    parts = _COMPACT.split(text)
    gaps = parts[::_GROUPS]
    n = len(gaps) - 1
    if (n < 1 or gaps[-1].rstrip(_WHITESPACE) != "}"
            or gaps[1:-1].count(",") != n - 1):
        return None
    meta = _compact_metadata(gaps[0].lstrip(_WHITESPACE))
    found = _known(parts[2::_GROUPS], specs, _compact_spec)
    if meta is None or found is None:
        return None
    begins, ends = parts[3::_GROUPS], parts[4::_GROUPS]
    starts = list(map(int, begins))
    if begins[0] == "0" and ends[:-1] == begins[1:] and int(ends[-1]) == data_bytes:
        spans = list(map(sub, starts[1:] + [data_bytes], starts))  # chained in header order
    else:
        stops = list(map(int, ends))
        spans = list(map(sub, stops, starts))
        if not _tiles(starts, stops, data_bytes):
            return None
    if spans != list(map(itemgetter(1), found)):
        return None
    return parts[1::_GROUPS], found, starts, meta


def _compact_metadata(head: str) -> dict[str, str] | None:
    """What precedes the first entry: ``{`` or ``{"__metadata__":<null or strings>,``."""
    if head == "{":
        return {}
    if not (head.startswith('{"__metadata__":') and head.endswith(",")):
        return None
    try:
        value = json.loads(head[:-1] + "}")
    except (ValueError, RecursionError):
        return None
    if len(value) != 1:  # more than the metadata before the first compact entry
        return None
    meta = value["__metadata__"]
    if meta is None and head.count(":") == 1:
        return {}
    if (type(meta) is dict and set(map(type, meta.values())) <= {str}
            and head.count(":") == 1 + len(meta) + _colons(meta)):  # no key twice
        return meta
    return None


def _colons(meta: dict[str, str]) -> int:
    """The ``:`` inside the metadata's strings; without escapes, as many as in its text,
    so :func:`no_duplicates`' count stays exact (the dtype strings, checked, hold none)."""
    return sum(map(str.count, chain(meta, meta.values()), repeat(":")))


def _compact_spec(text: str) -> tuple[TensorSpec, int]:
    value = json.loads("{" + text + "}")  # '"dtype":"D","shape":[dims]'; dims may be bad
    return _spec(value["dtype"], tuple(value["shape"]))


def _known(idents: list, specs: SpecCache, make: Callable[[Any], tuple[TensorSpec, int]]
           ) -> list[tuple[TensorSpec, int]] | None:
    """``specs[ident]`` for each ident, each new one made (checked) once; ``None`` when an
    ident is unhashable or invalid."""
    try:
        found = list(map(specs.get, idents))
        if None in found:
            for ident in set(idents).difference(specs):
                specs[ident] = make(ident)
            found = list(map(specs.get, idents))
    except (TypeError, ValueError):
        return None
    return cast(list[tuple[TensorSpec, int]], found)


def _json_columns_of(path: str, text: str, raw: bytes, data_start: int, data_bytes: int,
                     specs: SpecCache) -> Columns | None:
    try:
        header = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if type(header) is not dict:
        return None
    pairs = len(header)
    meta = header.pop("__metadata__", None)
    if meta is not None:
        if type(meta) is not dict or not set(map(type, meta.values())) <= {str}:
            return None
        pairs += len(meta)
    if b"\\" not in raw:  # no escapes: the colons inside strings are those of the values
        pairs += sum(map(str.count, header, repeat(":"))) + _colons(meta or {})
    columns = _json_columns(header, specs)
    if columns is None or not no_duplicates(raw, pairs + 3 * len(header)):
        return None
    found, begins, ends = columns
    if not _tiles(begins, ends, data_bytes):
        return None
    keys = list(header)
    return keys, _entries(path, keys, found, begins, data_start), dict(meta or {})


def _json_columns(header: dict, specs: SpecCache
                  ) -> tuple[list[tuple[TensorSpec, int]], list[int], list[int]] | None:
    """Each entry's (spec, nbytes) and data offsets, when every entry is an object of
    exactly the three fields and its offsets span exactly its bytes."""
    infos = list(header.values())
    try:
        if not infos or set(map(len, infos)) != {3}:
            return None
        dtypes, shapes, offsets = zip(*map(_FIELDS, infos), strict=True)  # a list: TypeError
        # a shape "" or {} would pass as () below, and False or 2.0 as the cached 0 or 2
        if (set(map(type, shapes)) != {list} or set(map(len, offsets)) != {2}
                or not set(map(type, chain.from_iterable(shapes))) <= {int}):
            return None
        begins, ends = map(list, zip(*offsets, strict=True))
        idents = list(zip(dtypes, map(tuple, shapes), strict=True))
    except (TypeError, KeyError):
        return None
    found = _known(idents, specs, lambda i: _spec(*i))
    if (found is None or set(map(type, begins)) != {int} or set(map(type, ends)) != {int}
            or list(map(sub, ends, begins)) != list(map(itemgetter(1), found))):
        return None
    return found, begins, ends


def _spec(dtype_name: object, shape: tuple) -> tuple[TensorSpec, int]:
    if type(dtype_name) is not str or dtype_name not in SAFETENSORS_DTYPES or not all(
            type(d) is int and 0 <= d < _FAST_DIM for d in shape):
        raise ValueError(dtype_name, shape)
    spec = TensorSpec(shape, SAFETENSORS_DTYPES[dtype_name])
    return spec, spec.nbytes


def _tiles(begins: list[int], ends: list[int], data_bytes: int) -> bool:
    """The spans ``[begin, end)`` (each ``end >= begin``) cover ``[0, data_bytes)`` exactly:
    in header order, else sorted."""
    if begins[0] == 0 and ends[-1] == data_bytes and begins[1:] == ends[:-1]:
        return True
    starts, stops = zip(*sorted(zip(begins, ends, strict=True)), strict=True)
    return starts[0] == 0 and stops[-1] == data_bytes and starts[1:] == stops[:-1]
