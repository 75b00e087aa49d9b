"""``quantization_config`` (config.json, or a model's config) → :class:`QuantConfig`.

Fine-grained FP8 (``quant_method: "fp8"``, DeepSeek-V3 / transformers'
``FineGrainedFP8Config``) is parsed here; the packed methods (MXFP4, compressed-tensors,
ModelOpt) give ``None`` here and are read by :mod:`.quant_formats`; any other method is
refused with a :class:`QuantizationError` naming it. Fields, as checkpoints spell them::

    {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
     "weight_block_size": [128, 128], "scale_fmt": "float" | "ue8m0",
     "modules_to_not_convert": [...] (alias "ignored_layers"), "dequantize": false}

A missing ``weight_block_size`` means (128, 128), transformers' default; an explicit
``null`` means one scale per tensor.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from weightplan.errors import QuantizationError
from weightplan.planner.inputs.quant_formats import PACKED_METHODS
from weightplan.planner.inputs.dtype import model_quantization_config

DEFAULT_BLOCK = (128, 128)
_MISSING = object()
_BOUNDARY = r"(?:(?<=\.)|(?=\.|$))"


@dataclass(frozen=True, slots=True)
class QuantConfig:
    """A parsed fine-grained FP8 ``quantization_config``."""

    fmt: str = "e4m3"
    block: tuple[int, ...] | None = DEFAULT_BLOCK  # None: one scale per tensor
    activation_scheme: str = "dynamic"
    scale_fmt: str = "float"
    modules_to_not_convert: tuple[str, ...] = ()
    dequantize: bool = False
    method: str = "fp8"
    source: str = field(default="config", compare=False)

    def skips(self, module: str) -> bool:
        """Whether ``module`` (a dotted module name) is left unquantized by
        ``modules_to_not_convert``, matched as transformers matches it: a pattern matches
        from the start up to a module boundary (also as a regex), or as a suffix."""
        return any(_skip_match(p, module) for p in self.modules_to_not_convert)

    def to_dict(self) -> dict:
        """The ``quantization_config`` to write next to a checkpoint saved in FP8."""
        return {"quant_method": self.method, "fmt": self.fmt,
                "activation_scheme": self.activation_scheme,
                "weight_block_size": None if self.block is None else list(self.block),
                "scale_fmt": self.scale_fmt,
                "modules_to_not_convert": list(self.modules_to_not_convert) or None}


def parse_quant_config(raw: object, *, source: str = "config") -> QuantConfig | None:
    """Parse a ``quantization_config``: a dict, an object with ``to_dict()`` (transformers'
    ``FineGrainedFP8Config``), or ``None`` (→ ``None``).

    Raises:
        QuantizationError: another ``quant_method``, or a field with a wrong value.
    """
    if raw is None:
        return None
    data = _as_dict(raw, source)
    method = _text(data.get("quant_method", "")).lower()
    if method in PACKED_METHODS:  # MXFP4, compressed-tensors, ModelOpt: see quant_formats
        return None
    if method != "fp8":
        raise QuantizationError(
            f"quant_method {data.get('quant_method')!r} is not supported: weightplan loads "
            "quant_method 'fp8' (block FP8), "
            f"{', '.join(repr(m) for m in PACKED_METHODS[:-1])} and {PACKED_METHODS[-1]!r}; "
            "dequantize it with its own library first", file=source)
    return QuantConfig(
        fmt=_choice(data, "fmt", ("e4m3", "e5m2"), "e4m3", source),
        block=_block(data.get("weight_block_size", _MISSING), source),
        activation_scheme=_choice(data, "activation_scheme", ("dynamic", "static"), "dynamic",
                                  source),
        scale_fmt=_choice(data, "scale_fmt", ("float", "ue8m0"), "float", source),
        modules_to_not_convert=_names(data, source),
        dequantize=bool(data.get("dequantize") or False),
        source=source)


def read_quant_config(directory: str | Path) -> QuantConfig | None:
    """The ``quantization_config`` of ``directory/config.json`` (``None`` when there is no
    config.json or it has none)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise QuantizationError(f"unreadable config.json: {e}", file=str(path)) from e
    return quant_config_in(data, path)


def quant_config_in(data: object, path: Path) -> QuantConfig | None:
    """The ``quantization_config`` of ``path`` (a ``config.json``), read as ``data``."""
    if not isinstance(data, Mapping):
        return None
    return parse_quant_config(data.get("quantization_config"), source=str(path))


def quant_config_of_model(model: object) -> QuantConfig | None:
    """The FP8 ``quantization_config`` a model's ``config`` carries, if any."""
    return parse_quant_config(model_quantization_config(model),
                              source=f"{type(model).__name__}.config")


def _skip_match(pattern: str, module: str) -> bool:
    if module.endswith(pattern):
        return True
    try:
        return re.match(rf"(?:{pattern}){_BOUNDARY}", module) is not None
    except re.error:
        return module == pattern or module.startswith(pattern + ".")


def _text(value: object) -> str:
    """A string, or a str-valued enum's value (transformers' ``QuantizationMethod.FP8``)."""
    return str(getattr(value, "value", value))


def _as_dict(raw: object, source: str) -> Mapping:
    if isinstance(raw, Mapping):
        return raw
    to_dict = getattr(raw, "to_dict", None)
    if callable(to_dict):
        data = to_dict()
        if isinstance(data, Mapping):
            return data
    raise QuantizationError(f"quantization_config is a {type(raw).__name__}, not an object",
                            file=source)


def _choice(data: Mapping, name: str, allowed: tuple[str, ...], default: str, source: str) -> str:
    value = data.get(name)
    if value is None:
        return default
    value = _text(value).lower()
    if value not in allowed:
        raise QuantizationError(f"quantization_config.{name} is {data.get(name)!r}; weightplan "
                                f"knows {', '.join(allowed)}", file=source)
    return value


def _block(value: object, source: str) -> tuple[int, int] | None:
    if value is _MISSING:
        return DEFAULT_BLOCK
    if value is None:
        return None
    if not (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise QuantizationError(f"quantization_config.weight_block_size is {value!r}; it must "
                                "be two positive integers, e.g. [128, 128]", file=source)
    return (int(value[0]), int(value[1]))


def _names(data: Mapping, source: str) -> tuple[str, ...]:
    value = data.get("modules_to_not_convert")
    if value is None:
        value = data.get("ignored_layers")
    if value is None:
        return ()
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise QuantizationError(f"quantization_config.modules_to_not_convert is {value!r}; it "
                                "must be a list of module names", file=source)
    return tuple(value)
