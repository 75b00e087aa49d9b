"""Byte sizes: parse ``"8GiB"`` / ``"5GB"`` and format ``1.52 GiB``; counts of things:
``1 file``, ``2 files`` (:func:`counted`)."""

from __future__ import annotations

import math
import numbers
import re

from weightplan.errors import PlanError

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2,
          "gib": 1024**3, "tib": 1024**4}


def parse_bytes(value: int | float | str, *, what: str = "size") -> int:
    """``4096``, ``"4KiB"``, ``"1.5GB"`` → bytes. Raises :class:`PlanError` otherwise."""
    if isinstance(value, bool):
        raise PlanError(f"{what} must be a number of bytes or a string like '8GiB', got {value!r}")
    if isinstance(value, numbers.Real):
        if not math.isfinite(value):
            raise PlanError(f"{what} must be a finite number of bytes, got {value!r}")
        if value < 0:
            raise PlanError(f"{what} must not be negative, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise PlanError(f"{what} must be a number of bytes or a string like '8GiB', got a "
                        f"{type(value).__name__}")
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
    if not m or m.group(2).lower() not in _UNITS:
        raise PlanError(f"can't parse {what} {value!r}: use bytes or a string like '8GiB', "
                        "'512MB', '1.5GB'")
    if len(m.group(2)) == 2 and m.group(2).endswith("b"):  # (transformers reads bits)
        unit = m.group(2)[0].upper()
        raise PlanError(f"{what} {value!r}: a lower-case 'b' means bits to transformers and "
                        f"accelerate ('5Gb' is 625MB), bytes elsewhere; write "
                        f"'{m.group(1)}{unit}B' for bytes, or the size in bytes")
    number = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(number):
        raise PlanError(f"{what} {value!r} is too large")
    return int(number)


def format_bytes(n: int | float) -> str:
    """Binary units, 3 significant digits: ``1.52 GiB``; whole bytes below 1 KiB.

    A value that would round to 1000 of a unit (999.5 and up) is given in the next unit
    (``0.977 MiB``, not ``1e+03 KiB``); past 999.5 TiB the TiB are whole numbers.
    """
    n = float(n)
    if abs(n) < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if abs(n) < 999.5:
            return f"{n:.3g} {unit}"
    return f"{n:.0f} TiB"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 file``, ``0 files``, ``2 files`` (``plural``: where it isn't ``noun + "s"``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def agreeing(n: int, one: str, many: str) -> str:
    """The verb that agrees with :func:`counted`'s ``n``: ``1 tensor doesn't``, ``2 tensors
    don't``."""
    return one if n == 1 else many
