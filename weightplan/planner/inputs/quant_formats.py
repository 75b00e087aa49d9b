"""The quantization configs of packed formats → :class:`FormatConfig` (schemes by target).

Recognised (block FP8, ``quant_method: "fp8"``, stays in :mod:`.quant_config`):

- ``quant_method: "mxfp4"`` (gpt-oss): MXFP4 for every ``*_blocks`` / ``*_scales`` pair;
  ``modules_to_not_convert`` is the ignore list.
- ``quant_method: "compressed-tensors"``: ``config_groups.*.{targets, weights, format}``
  and ``ignore``; the (group or global) ``format`` picks the layout: ``float-quantized``
  / ``naive-quantized`` (FP8), ``pack-quantized`` (INT4/INT8), ``nvfp4-pack-quantized``.
- ModelOpt: ``quant_method: "modelopt"`` in config.json, or ``hf_quant_config.json``'s
  ``quantization.{quant_algo: "NVFP4", group_size, exclude_modules}``.

Act-order (``actorder: "group"``: GPTQ's ``weight_g_idx``) is read for pack-quantized.
Anything else these methods can say (MXFP4/MXFP6 pack formats,
asymmetric FP8, bits other than 4/8) is refused with a :class:`QuantizationError` naming
the config file and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from weightplan.errors import QuantizationError
from weightplan.planner.core.quant.formats import Scheme

PACKED_METHODS = ("mxfp4", "compressed-tensors", "modelopt")
_CT_FORMATS = {"float-quantized": "fp8", "naive-quantized": "fp8", "pack-quantized": "int",
               "nvfp4-pack-quantized": "nvfp4"}
_STRATEGIES = {"tensor": "tensor", "channel": "channel", "group": "group", "block": "block",
               "tensor_group": "group"}


@dataclass(frozen=True, slots=True)
class FormatGroup:
    """One ``config_groups`` entry: the modules it targets and how their weights are stored."""

    targets: tuple[str, ...]
    scheme: Scheme


@dataclass(frozen=True)
class FormatConfig:
    """A packed-format quantization config, with the file it came from."""

    method: str
    groups: tuple[FormatGroup, ...]
    ignore: tuple[str, ...] = ()
    source: str = "config"

    def scheme_for(self, module: str) -> Scheme | None:
        """The scheme of ``module`` (a dotted module name): the first group whose ``re:``
        target matches it, else the first group targeting a class name (headers don't
        say a module's class; a quantized weight is taken as a ``Linear``'s); ``None``:
        ignored."""
        ignored, targeted, fallback = self._matchers
        if ignored is not None and ignored.fullmatch(module):
            return None
        for regex, scheme in targeted:
            if regex.fullmatch(module):
                return scheme
        return fallback

    @cached_property
    def digit_blind(self) -> bool:
        """Whether :meth:`scheme_for` treats every digit alike: no ASCII digit in the
        ignore list or in a ``re:`` target (``\\d`` is fine). Then a module and its
        template (every digit made ``1``: the layers and experts of a stack) get the
        same scheme."""
        patterns = [*self.ignore, *(t for g in self.groups for t in g.targets
                                    if t.startswith("re:"))]
        return not any(c in "0123456789" for p in patterns for c in p)

    @cached_property
    def _matchers(self) -> tuple[re.Pattern | None, list[tuple[re.Pattern, Scheme]], Scheme | None]:
        """The ignore list as one regex, each group's ``re:`` targets as one, and the
        class-name group's scheme (a module name is matched once per pattern set, not once
        per pattern: Kimi-K2 has 69k expert weights)."""
        targeted = [(r, g.scheme) for g in self.groups
                    if (r := _combined([t for t in g.targets if t.startswith("re:")])) is not None]
        fallback = next((g.scheme for g in self.groups
                         if any(not t.startswith("re:") for t in g.targets)), None)
        return _combined(list(self.ignore)), targeted, fallback


def _combined(patterns: list[str]) -> re.Pattern | None:
    """One regex that fully matches what :func:`matches` matches for any of ``patterns``."""
    parts = []
    for p in patterns:
        if p.startswith("re:"):
            try:
                re.compile(p[3:])
            except re.error:
                continue
            parts.append(f"(?:{p[3:]}).*")
        else:
            name = re.escape(p)
            parts.append(f"{name}(?:\\..*)?|.*\\.{name}")
    return re.compile("|".join(f"(?:{x})" for x in parts), re.DOTALL) if parts else None


def matches(pattern: str, module: str) -> bool:
    """compressed-tensors' matching: ``re:<regex>`` searched in full, else the name or a
    dotted suffix of it."""
    if pattern.startswith("re:"):
        try:
            return re.fullmatch(pattern[3:], module) is not None or \
                re.match(pattern[3:], module) is not None
        except re.error:
            return False
    return module == pattern or module.endswith("." + pattern) or \
        module.startswith(pattern + ".")


def packed_method(raw: object) -> str | None:
    """The packed method a ``quantization_config`` names (``None``: another one)."""
    data = raw.to_dict() if hasattr(raw, "to_dict") else raw
    if not isinstance(data, Mapping):
        return None
    method = str(getattr(data.get("quant_method"), "value", data.get("quant_method", ""))).lower()
    return method if method in PACKED_METHODS else None


_UNREAD: Mapping = {}  # (config.json not read yet: read here)


def read_format_config(directory: str | Path, config: Mapping | None = _UNREAD
                       ) -> FormatConfig | None:
    """The packed-format config of a checkpoint directory (config.json's
    ``quantization_config``, or ``hf_quant_config.json``); ``None``: none. ``config``:
    config.json as its caller read it (``None``: there is none)."""
    directory = Path(directory)
    modelopt = directory / "hf_quant_config.json"
    if modelopt.is_file():
        data = _json(modelopt)
        quant = data.get("quantization", data)
        return _modelopt(quant if isinstance(quant, Mapping) else {}, str(modelopt))
    path = directory / "config.json"
    if config is _UNREAD:
        config = _json(path) if path.is_file() else None
    if config is None:
        return None
    raw = config.get("quantization_config")
    if packed_method(raw) is None:
        return None
    assert isinstance(raw, Mapping)
    return parse_format_config(raw, source=str(path))


def parse_format_config(data: Mapping, *, source: str = "config") -> FormatConfig:
    """Parse a packed-format ``quantization_config`` (see the module docstring)."""
    method = packed_method(data)
    if method == "mxfp4":
        ignore = tuple(_glob(p) for p in data.get("modules_to_not_convert") or ())
        return FormatConfig("mxfp4", (FormatGroup(("Linear",), Scheme("mxfp4", source="mxfp4")),),
                            ignore, source)
    if method == "modelopt":
        return _modelopt(data, source)
    return _compressed_tensors(data, source)


def _modelopt(data: Mapping, source: str) -> FormatConfig:
    algo = str(data.get("quant_algo", "")).upper()
    if algo != "NVFP4":
        raise QuantizationError(f"ModelOpt quant_algo {data.get('quant_algo')!r} is not "
                                "supported: weightplan reads ModelOpt NVFP4", file=source)
    group = data.get("group_size", 16)
    if group != 16:
        raise QuantizationError(f"ModelOpt NVFP4 group_size is {group!r}; NVFP4 has 16 "
                                "elements per scale", file=source)
    scheme = Scheme("nvfp4", "group", 16, global_divides=False, source="ModelOpt")
    ignore = tuple(_glob(p) for p in data.get("exclude_modules") or ())
    return FormatConfig("modelopt", (FormatGroup(("Linear",), scheme),), ignore, source)


def _glob(pattern: str) -> str:
    """ModelOpt's ``exclude_modules`` are shell globs: as a ``re:`` pattern."""
    return "re:" + re.escape(pattern).replace(r"\*", ".*") if "*" in pattern else pattern


def _compressed_tensors(data: Mapping, source: str) -> FormatConfig:
    groups_raw = data.get("config_groups") or {}
    if not isinstance(groups_raw, Mapping) or not groups_raw:
        raise QuantizationError("compressed-tensors quantization_config has no config_groups",
                                file=source)
    fmt = data.get("format")
    groups = []
    for name, group in groups_raw.items():
        if not isinstance(group, Mapping) or not isinstance(group.get("weights"), Mapping):
            continue  # activation-only groups: the weights are plain
        targets = tuple(group.get("targets") or ())
        scheme = _ct_scheme(group["weights"], group.get("format") or fmt, f"{source}: "
                            f"config_groups.{name}")
        groups.append(FormatGroup(targets, scheme))
    ignore = data.get("ignore") or ()
    if isinstance(ignore, str) or not all(isinstance(p, str) for p in ignore):
        raise QuantizationError(f"compressed-tensors ignore is {ignore!r}; it must be a list "
                                "of module names", file=source)
    return FormatConfig("compressed-tensors", tuple(groups), tuple(ignore), source)


def _ct_scheme(weights: Mapping, fmt: object, where: str) -> Scheme:
    kind = _CT_FORMATS.get(str(fmt))
    if kind is None:
        raise QuantizationError(f"format {fmt!r} is not supported (weightplan reads "
                                f"{', '.join(_CT_FORMATS)})", file=where)
    bits, strategy = weights.get("num_bits"), _STRATEGIES.get(str(weights.get("strategy")))
    group, block = weights.get("group_size"), weights.get("block_structure")
    symmetric = weights.get("symmetric", True) is not False
    if strategy is None:
        raise QuantizationError(f"weights.strategy {weights.get('strategy')!r} is not one of "
                                f"{', '.join(_STRATEGIES)}", file=where)
    if weights.get("actorder") not in (None, False, True, "weight", "static", "group"):
        raise QuantizationError(f"weights.actorder {weights.get('actorder')!r} is not one of "
                                "group, weight, static", file=where)
    act_order = weights.get("actorder") in (True, "group")  # weight_g_idx per weight
    if kind == "fp8" and (bits != 8 or weights.get("type") != "float" or not symmetric):
        raise QuantizationError(f"{fmt} with num_bits {bits}, type {weights.get('type')!r}, "
                                f"symmetric {symmetric}: weightplan reads symmetric FP8", file=where)
    if kind == "int" and (bits not in (4, 8) or weights.get("type", "int") != "int"):
        raise QuantizationError(f"pack-quantized with num_bits {bits!r}: weightplan reads "
                                "int4 and int8", file=where)
    if kind == "nvfp4" and group not in (None, 16):
        raise QuantizationError(f"nvfp4 group_size {group!r}: NVFP4 has 16 per scale",
                                file=where)
    if strategy == "group" and not (isinstance(group, int) and group > 0):
        raise QuantizationError(f"weights.group_size is {group!r}; a group strategy needs a "
                                "positive group size", file=where)
    if strategy == "block" and not (isinstance(block, (list, tuple)) and len(block) == 2):
        raise QuantizationError(f"weights.block_structure is {block!r}; a block strategy "
                                "needs [rows, cols]", file=where)
    return Scheme(kind, "group" if kind == "nvfp4" else strategy,
                  16 if kind == "nvfp4" else group,
                  tuple(block) if strategy == "block" else None,  # type: ignore[arg-type]
                  8 if kind == "fp8" else int(bits or 4), symmetric,
                  act_order=act_order and kind == "int")


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise QuantizationError(f"unreadable quantization config: {e}", file=str(path)) from e
    if not isinstance(data, dict):
        raise QuantizationError("the quantization config is not a JSON object", file=str(path))
    return data
