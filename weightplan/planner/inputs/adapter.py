"""Adapter directories (peft's format): ``adapter_config.json`` + ``adapter_model.safetensors``.

Only LoRA loads (with rsLoRA, per-module ``rank_pattern`` / ``alpha_pattern``, DoRA's
magnitude vectors, ``modules_to_save``); any other ``peft_type`` is refused by name. The
config is read like a model config: a regular file, size-capped, strict JSON.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from weightplan.errors import AdapterError, CheckpointError
from weightplan.limits import MAX_CONFIG_BYTES
from weightplan.planner.inputs.paths import ADAPTER_CONFIG, open_regular
from weightplan.planner.inputs.paths import is_adapter_dir  # noqa: F401 (its marker test)
from weightplan.planner.inputs.safetensors_format import strict_json

CONFIG_FILE = ADAPTER_CONFIG
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLED_WEIGHTS = "adapter_model.bin"


@dataclass(frozen=True)
class AdapterConfig:
    """What a LoRA ``adapter_config.json`` says (peft's field names)."""

    file: str
    peft_type: str
    r: int
    lora_alpha: float
    use_rslora: bool = False
    use_dora: bool = False
    target_modules: tuple[str, ...] | str | None = None  # a str is one regex (peft)
    target_parameters: tuple[str, ...] = ()
    rank_pattern: Mapping[str, int] = field(default_factory=dict)
    alpha_pattern: Mapping[str, float] = field(default_factory=dict)
    modules_to_save: tuple[str, ...] = ()
    base_model: str | None = None
    raw: Mapping[str, object] = field(default_factory=dict, compare=False, repr=False)

    def rank_alpha(self, module: str) -> tuple[int, float]:
        """Rank and alpha of ``module`` (a dotted name): the first ``rank_pattern`` /
        ``alpha_pattern`` key matching its end, as peft matches them, else ``r`` / alpha."""
        return (int(_pattern_value(self.rank_pattern, module, self.r)),
                float(_pattern_value(self.alpha_pattern, module, self.lora_alpha)))

    def names_parameter(self, parameter: str) -> bool:
        """Whether ``target_parameters`` names ``parameter`` (a dotted path, or a bare
        parameter name such as ``gate_up_proj``) as peft matches it: by its end."""
        return any(t == parameter or t.endswith(f".{parameter}") or parameter.endswith(f".{t}")
                   for t in self.target_parameters)

    def scale(self, module: str) -> float:
        """``alpha / r`` (``alpha / √r`` with rsLoRA): the factor of ``B·A`` in the delta."""
        r, alpha = self.rank_alpha(module)
        return scale_of(r, alpha, self.use_rslora)


@dataclass(frozen=True)
class Adapter:
    """An adapter directory: its config and its one weights file."""

    directory: str
    config: AdapterConfig
    weights: str


def scale_of(r: int, alpha: float, rslora: bool) -> float:
    return alpha / math.sqrt(r) if rslora else alpha / r


def _pattern_value(patterns: Mapping[str, float], module: str, default: float) -> float:
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?(?:{key})$", module):
            return value
    return default


def read_adapter(directory: str | os.PathLike[str]) -> Adapter:
    """The adapter in ``directory``.

    Raises:
        AdapterError: no or malformed ``adapter_config.json`` (naming the file and the
            field), a type other than LoRA (naming it), or no ``adapter_model.safetensors``.
    """
    directory = os.fspath(directory)
    config = read_adapter_config(os.path.join(directory, CONFIG_FILE))
    weights = os.path.join(directory, WEIGHTS_FILE)
    if not os.path.isfile(weights):
        pickled = os.path.isfile(os.path.join(directory, PICKLED_WEIGHTS))
        why = (f"only {PICKLED_WEIGHTS} (pickle, which can run code: never read; convert it "
               "with peft in a trusted process)" if pickled else "no weights file")
        raise AdapterError(f"{weights}: not found; the adapter has {why}")
    return Adapter(directory, config, weights)


def read_adapter_config(path: str) -> AdapterConfig:
    """``adapter_config.json`` parsed and checked; :class:`AdapterError` naming ``path``."""
    return adapter_config_from(_read_json(path), path)


def adapter_config_from(data: dict, path: str) -> AdapterConfig:
    """An ``adapter_config.json``'s fields checked (``path`` names it in errors)."""
    peft_type = data.get("peft_type")
    if not isinstance(peft_type, str):
        raise AdapterError(f"{path}: no peft_type; is this a peft adapter_config.json?")
    if peft_type.upper() != "LORA":
        raise AdapterError(f"{path}: peft_type {peft_type!r} is not supported; weightplan "
                           "loads LoRA adapters (use peft's PeftModel.from_pretrained for "
                           f"{peft_type})")
    return AdapterConfig(
        path, "LORA", int(_number(data, "r", path, int, 8)), _number(data, "lora_alpha", path, float, 8),
        _flag(data, "use_rslora", path), _flag(data, "use_dora", path),
        _targets(data.get("target_modules"), path, "target_modules"),
        _names(data.get("target_parameters"), path, "target_parameters"),
        _int_patterns(data, path), _patterns(data, "alpha_pattern", path, float),
        _names(data.get("modules_to_save"), path, "modules_to_save"),
        data.get("base_model_name_or_path") if isinstance(
            data.get("base_model_name_or_path"), str) else None,
        MappingProxyType(data))


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        raise AdapterError(f"{path}: not found; an adapter directory holds peft's "
                           f"{CONFIG_FILE} next to {WEIGHTS_FILE}")
    try:
        fd = open_regular(path)
        try:
            size = os.fstat(fd).st_size
            if MAX_CONFIG_BYTES.exceeded_by(size):
                raise AdapterError(f"{path}: {size} bytes is too large for an adapter config; "
                                   f"{MAX_CONFIG_BYTES.hint()}")
            raw = os.pread(fd, size, 0)
        finally:
            os.close(fd)
        data = strict_json(raw, file=path, what="adapter config")
    except CheckpointError as e:
        raise AdapterError(f"{path}: can't read this adapter config: {e}") from e
    if not isinstance(data, dict):
        raise AdapterError(f"{path}: not a JSON object")
    return data


def _number(data: dict, name: str, path: str, kind: type, default: float) -> float:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (
            kind is int and value != int(value)):
        raise AdapterError(f"{path}: {name} must be a positive number, got {value!r}")
    return kind(value)


def _flag(data: dict, name: str, path: str) -> bool:
    value = data.get(name) or False
    if not isinstance(value, bool):
        raise AdapterError(f"{path}: {name} must be true or false, got {value!r}")
    return value


def _names(value: object, path: str, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AdapterError(f"{path}: {name} must be a list of names, got {value!r}")
    return tuple(value)


def _targets(value: object, path: str, name: str) -> tuple[str, ...] | str | None:
    if value is None or isinstance(value, str):
        return value
    return _names(value, path, name)


def _int_patterns(data: dict, path: str) -> Mapping[str, int]:
    return MappingProxyType({k: int(v) for k, v in _patterns(data, "rank_pattern", path,
                                                             int).items()})


def _patterns(data: dict, name: str, path: str, kind: type) -> Mapping[str, float]:
    value = data.get(name) or {}
    if not isinstance(value, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
            for v in value.values()):
        raise AdapterError(f"{path}: {name} must map module patterns to positive numbers, "
                           f"got {value!r}")
    return MappingProxyType({k: kind(v) for k, v in value.items()})
