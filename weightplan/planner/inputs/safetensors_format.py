"""A safetensors header, read as safetensors' own reader reads it, and a few things it
leaves to luck refused too:

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

:func:`header_columns` reads a header one of two ways, chosen by one test of its text:
**the writers' layout** (safetensors' own writer and weightplan's: compact JSON, entries
``"key":{"dtype":"D","shape":[dims],"data_offsets":[b,e]}``, no escapes) is cut into
columns by one regular-expression split and checked column by column at C speed; **any
other text** is parsed as strict JSON and checked entry by entry, which also says what is
wrong with a header the first way declines. Both apply the same rules
(:func:`_entry_spec`; spans that tile the data); tests/planner/test_fast_headers.py holds
them equal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from operator import itemgetter, sub

from weightplan.errors import HeaderError, NotSafetensorsError, TruncatedCheckpointError
from weightplan.planner.core.entry import TensorEntry, build_entries
from weightplan.planner.core.spec import SAFETENSORS_DTYPES, TensorSpec

__all__ = ["MAX_DEPTH", "MAX_HEADER_BYTES", "MAX_INDEX_BYTES", "Columns", "SpecCache",
           "header_columns", "json_depth_ok", "strict_json"]

MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 64
MAX_DIM = 2**63 - 1  # torch sizes are int64
MAX_OFFSET = 2**64 - 1  # safetensors' offsets are u64

# (dtype name, shape) or the writers' text of both → (spec, nbytes); one per checkpoint,
# so its files share one spec object per dtype and shape
SpecCache = dict[object, tuple[TensorSpec, int]]
Columns = tuple[list[str], list[TensorEntry], dict[str, str]]  # keys, entries, __metadata__

# The writers' layout, entries in offset order. Keys and dtypes are ``[^"]*``: the text
# holds no backslash (no escapes) and no control character (JSON refuses them raw),
# checked once over the bytes, so a string's text is its value; offsets are canonical
# integers. A match runs from one entry's ``,end`` to the next entry's ``begin``, which
# must be the same text (``\1``): each offset is captured once, and the matches must
# follow each other with nothing between. It starts with a literal comma, so a run of
# digits is tried once, not from each of its digits (quadratic in its length).
_CHAINED = re.compile(r',(0|[1-9][0-9]*)\]\},"([^"]*)":\{("dtype":"[^"]*","shape":\[[0-9,]*\]),'
                      r'"data_offsets":\[\1')
# What precedes the first match: ``{``, the metadata, the first entry up to its ``0``
_FIRST = re.compile(r'(.*)"([^"]*)":\{("dtype":"[^"]*","shape":\[[0-9,]*\]),'
                    r'"data_offsets":\[0', re.DOTALL)
_LINKS = 4  # what the split yields per match: the text before it, then its 3 groups
_NOT_PLAIN = bytes(range(32)) + b"\\"
_WHITESPACE = " \t\n\r"  # JSON's


def header_columns(path: str, raw: bytes, data_start: int, size: int,
                   specs: SpecCache | None = None) -> Columns:
    """The keys (distinct, in header order), entries and ``__metadata__`` of the header
    ``raw`` of the file ``path`` (``size`` bytes, its data from ``data_start``), every rule
    checked; ``specs`` is shared across a checkpoint's files.

    Raises:
        HeaderError: (or a subclass) naming ``path`` and the key at fault.
    """
    specs = {} if specs is None else specs
    parsed = _writer_layout(path, raw, data_start, size - data_start, specs)
    if parsed is None:  # another layout, or a rule broken: entry by entry names the fault
        parsed = _any_layout(path, raw, data_start, size, specs)
    return parsed


def _writer_layout(path: str, raw: bytes, data_start: int, data_bytes: int,
                   specs: SpecCache) -> Columns | None:
    """The header when its text is ``{``, an optional ``"__metadata__":{...},``, two or
    more entries ``"key":{"dtype":"D","shape":[dims],"data_offsets":[begin,end]}`` joined
    by single commas, the first beginning at 0, each at the previous one's end, the last
    ending at the end of the file, and ``}``: byte for byte JSON whose meaning is the
    columns, read without a dict per entry. ``None`` when the text is anything else or
    breaks a rule (the other way then says which)."""
    if len(raw.translate(None, _NOT_PLAIN)) != len(raw):
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    parts = _CHAINED.split(text)
    links = len(parts) // _LINKS  # entries after the first
    if (links < 1 or parts[_LINKS:-1:_LINKS].count("") != links - 1
            or parts[-1].rstrip(_WHITESPACE) != f",{data_bytes}]}}}}"):
        return None
    first = _FIRST.fullmatch(parts[0])
    if first is None:
        return None
    meta = _head_metadata(path, first[1].lstrip(_WHITESPACE))
    idents = parts[3::_LINKS]
    idents.insert(0, first[3])
    found = _known(idents, specs)
    if meta is None or found is None:
        return None
    starts = [0, *map(int, parts[1::_LINKS])]
    if list(map(sub, [*starts[1:], data_bytes], starts)) != list(map(itemgetter(1), found)):
        return None
    keys = parts[2::_LINKS]
    keys.insert(0, first[2])
    distinct = set(keys)
    if len(distinct) != len(keys) or "__metadata__" in distinct:  # a key twice, or metadata
        return None
    made = build_entries(keys, map(itemgetter(0), found), path, map(data_start.__add__, starts))
    return keys, made, meta


def _head_metadata(path: str, head: str) -> dict[str, str] | None:
    """What precedes the first entry: ``{`` or ``{"__metadata__":<null or strings>,``."""
    if head == "{":
        return {}
    if not (head.startswith('{"__metadata__":') and head.endswith(",")):
        return None
    try:
        value = strict_json((head[:-1] + "}").encode(), file=path)
        if not isinstance(value, dict) or len(value) != 1:  # more before the first entry
            return None
        return _metadata(path, value["__metadata__"])
    except HeaderError:
        return None


def _known(idents: list[str], specs: SpecCache) -> list[tuple[TensorSpec, int]] | None:
    """``(spec, nbytes)`` of each entry's ``"dtype":"D","shape":[dims]`` text, each distinct
    text read and checked once; ``None`` when one is not JSON or breaks a rule."""
    for ident in set(idents).difference(specs):
        try:
            value = json.loads("{" + ident + "}")
            specs[ident] = _entry_spec("", "", value["dtype"], value["shape"], specs)
        except (ValueError, HeaderError):
            return None
    return list(map(specs.__getitem__, idents))


def _any_layout(path: str, raw: bytes, data_start: int, size: int, specs: SpecCache
                ) -> Columns:
    """The header parsed as strict JSON and checked entry by entry, in header order."""
    if raw.lstrip(b" \t\r\n")[:1] != b"{":
        raise NotSafetensorsError("header is not a JSON object", file=path)
    header = strict_json(raw, file=path)
    if not isinstance(header, dict):
        raise HeaderError("header is not a JSON object", file=path)
    meta = _metadata(path, header.pop("__metadata__", None))
    entries = {key: _entry(path, key, info, data_start, size, specs)
               for key, info in header.items()}
    spans = [(e.offset - data_start, e.offset - data_start + e.nbytes) for e in entries.values()]
    _check_coverage(path, list(entries), spans, size - data_start)
    return list(entries), list(entries.values()), meta


def _metadata(path: str, value: object) -> dict[str, str]:
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


def _entry(path: str, key: str, info: object, data_start: int, size: int,
           specs: SpecCache) -> TensorEntry:
    """One header entry, each rule checked in turn."""
    if not isinstance(info, dict):
        raise HeaderError("entry is not an object", file=path, key=key)
    for field_name in ("dtype", "shape", "data_offsets"):
        if field_name not in info:
            raise HeaderError(f"entry lacks {field_name!r}", file=path, key=key)
    spec, nbytes = _entry_spec(path, key, info["dtype"], info["shape"], specs)
    offsets = info["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(_is_int(o, MAX_OFFSET) for o in offsets) and offsets[0] <= offsets[1]):
        raise HeaderError(f"invalid data_offsets {offsets!r}: want [begin, end] with "
                          "0 <= begin <= end", file=path, key=key)
    begin, end = offsets
    if end - begin != nbytes:
        raise HeaderError(f"data_offsets span {end - begin} bytes but {info['dtype']}"
                          f"{list(spec.shape)} needs {nbytes}", file=path, key=key)
    if data_start + end > size:
        raise TruncatedCheckpointError(
            f"data ends at byte {data_start + end} but the file has {size} bytes", file=path,
            key=key)
    return TensorEntry(key, spec, path, data_start + begin)


def _entry_spec(path: str, key: str, dtype_name: object, shape: object, specs: SpecCache
                ) -> tuple[TensorSpec, int]:
    """The (shared) spec and byte size of a known dtype and a shape of non-negative
    integer dims (not booleans) whose running product fits in 63 bits."""
    if not isinstance(dtype_name, str) or dtype_name not in SAFETENSORS_DTYPES:
        raise HeaderError(f"unknown dtype {dtype_name!r}", file=path, key=key)
    if not isinstance(shape, list) or not all(_is_int(d, MAX_DIM) for d in shape):
        raise HeaderError(f"invalid shape {shape!r}: dims must be non-negative integers",
                          file=path, key=key)
    product = 1
    for d in shape:
        product *= d
        if product > MAX_DIM:
            raise HeaderError(f"shape {shape!r} has more elements than fit in 63 bits",
                              file=path, key=key)
    ident = (dtype_name, tuple(shape))  # exact: the dims are ints, never bools or floats
    if ident not in specs:
        spec = TensorSpec(ident[1], SAFETENSORS_DTYPES[dtype_name])
        specs[ident] = (spec, spec.nbytes)
    return specs[ident]


def _is_int(value: object, limit: int) -> bool:
    return type(value) is int and 0 <= value <= limit


def _check_coverage(path: str, keys: list[str], spans: list[tuple[int, int]],
                    data_bytes: int) -> None:
    """The spans (each inside the data), sorted, tile ``[0, data_bytes)`` exactly: no gap,
    overlap or trailing byte."""
    start, last = 0, None
    for key, (begin, end) in sorted(zip(keys, spans, strict=True), key=itemgetter(1)):
        if begin != start:
            what = "overlaps" if begin < start else "leaves a gap after"
            prev = f"the previous tensor {last!r}" if last is not None else "the data start"
            raise HeaderError(f"data_offsets [{begin}, {end}] {what} {prev} (which ends at "
                              f"{start}); tensors must cover the data exactly, in order",
                              file=path, key=key)
        start, last = end, key
    if start < data_bytes:
        raise HeaderError(f"{data_bytes - start} trailing bytes after the last tensor "
                          f"{last!r}; safetensors refuses such files", file=path)


def strict_json(raw: bytes, *, file: str, what: str = "header") -> object:
    """Parse ``raw`` as strict JSON: UTF-8, nested at most :data:`MAX_DEPTH` deep, no
    duplicate keys at any level, no ``NaN``/``Infinity``.

    Raises:
        HeaderError: naming ``file`` (and the key given twice) and what is wrong.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HeaderError(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start})",
                          file=file) from e

    def duplicate(key: str) -> HeaderError:
        return HeaderError(f"the {what} has this key twice (a reader would silently keep "
                           "one of them); the file is corrupt or crafted", file=file, key=key)

    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates(duplicate),
                           parse_constant=_refuse_constant)
    except HeaderError:
        raise
    except RecursionError as e:
        raise HeaderError(f"{what} JSON is nested too deeply", file=file) from e
    except ValueError as e:
        raise HeaderError(f"{what} is not valid JSON: {e}", file=file) from e
    if not json_depth_ok(value):
        raise HeaderError(f"{what} JSON is nested deeper than {MAX_DEPTH} levels", file=file)
    return value


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


def json_depth_ok(value: object, limit: int = MAX_DEPTH) -> bool:
    """Whether the parsed JSON ``value`` nests at most ``limit`` objects and arrays deep:
    one pass per level, over that level's values (told apart at C speed)."""
    level = [value]
    for _ in range(limit + 1):  # level: the values nested as deep as the pass number
        kinds = set(map(type, level))
        if dict not in kinds and list not in kinds:
            return True
        inner: list[object] = []
        for item in level:
            if type(item) is dict:
                inner.extend(item.values())
            elif type(item) is list:
                inner.extend(item)
        level = inner
    return False
