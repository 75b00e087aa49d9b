"""The dtype a load writes, the way transformers chooses it.

``dtype="auto"`` is the model config's ``dtype`` when it names one, else the floating dtype
most of the checkpoint's bytes have (the checkpoint's own dtype); ``None`` keeps the
model's dtypes. Tensors the model keeps in float32 stay float32 as in transformers:
``_keep_in_fp32_modules`` when loading in float16, ``_keep_in_fp32_modules_strict`` in
float16 or bfloat16 (globs searched in the tensor's name).

Whether the input is quantized at all (:func:`quantized_input`) is the one visible test in
front of the quantized phases (FP8 pairing, packed formats, dequantize / quantize nodes,
scale siblings, their findings): a plain checkpoint loaded into a plain model fails it, and
its load neither runs nor imports them. The test is a superset of what those phases look
at, so that whatever they would find (a pair, a problem, a refused ``quant_method``) they
still find: a checkpoint tensor in an FP8 dtype, or a key named like a scale
(``*_scale_inv``, ``*.activation_scale``, ``*.input_scale``: stray scales are reported); a
``quantization_config`` (or ModelOpt's ``hf_quant_config.json``) next to the checkpoint or
on the model's ``config``; a model parameter in an FP8 dtype.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping
from itertools import repeat
from operator import attrgetter
from pathlib import Path

import torch

from weightplan.errors import PlanError
from weightplan.planner.core.quant.blocks import FP8_DTYPES
from weightplan.planner.inputs.checkpoint import Checkpoint, DirectoryRead
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.inputs.model_init import declared_attr
from weightplan.planner.core.spec import parse_dtype

SCALE_SUFFIX = "_scale_inv"
ACTIVATION_SUFFIXES = (".activation_scale", ".input_scale")
SCALE_SUFFIXES = (SCALE_SUFFIX, *ACTIVATION_SUFFIXES)
MODELOPT_CONFIG = "hf_quant_config.json"
_SPEC_DTYPE = attrgetter("spec.dtype")


def resolve_dtype(dtype: object, model: torch.nn.Module | None,
                  checkpoint: Checkpoint) -> torch.dtype | None:
    """``dtype`` as a torch dtype: ``"auto"`` is resolved against config and checkpoint."""
    return dtype_of(dtype, getattr(model, "config", None), lambda: checkpoint)


def dtype_of(dtype: object, config: object,
             checkpoint: Callable[[], Checkpoint]) -> torch.dtype | None:
    """``dtype`` as a torch dtype; ``"auto"``: the one ``config`` names, else the one most of
    the checkpoint's bytes have (``checkpoint`` called only then: its headers are read)."""
    if not (isinstance(dtype, str) and dtype.lower() == "auto"):
        return parse_dtype(dtype)  # type: ignore[arg-type]
    configured = config_dtype(config)
    return configured if configured is not None else checkpoint_dtype(checkpoint())


def config_dtype(config: object) -> torch.dtype | None:
    """The dtype a (transformers) config names, if any (``torch_dtype`` in old configs)."""
    attr = "dtype" if hasattr(config, "dtype") else "torch_dtype"  # (deprecated name)
    value = getattr(config, attr, None)
    if isinstance(value, dict):  # per sub-config dtypes: not one dtype to cast to
        return None
    try:
        resolved = parse_dtype(value)
    except PlanError:
        return None
    return resolved if resolved is not None and resolved.is_floating_point else None


def checkpoint_dtype(checkpoint: Checkpoint) -> torch.dtype | None:
    """The floating dtype holding most of the checkpoint's bytes."""
    totals: dict[torch.dtype, int] = {}
    for entry in checkpoint.entries.values():
        if entry.spec.dtype.is_floating_point and entry.spec.dtype.itemsize > 1:
            totals[entry.spec.dtype] = totals.get(entry.spec.dtype, 0) + entry.spec.nbytes
    return max(totals, key=totals.__getitem__) if totals else None


def keep_fp32(model: torch.nn.Module | None, info: ModelInfo | None,
              dtype: torch.dtype | None) -> ModelInfo | None:
    """``info`` with the tensors the model keeps in float32 marked to keep their dtype."""
    if model is None or info is None or dtype not in (torch.float16, torch.bfloat16):
        return info
    globs = set(_declared(model, "_keep_in_fp32_modules_strict"))
    if dtype == torch.float16:
        globs |= set(_declared(model, "_keep_in_fp32_modules"))
    if not globs:
        return info
    pattern = re.compile("|".join(g.replace("*", ".*") for g in sorted(globs)))
    kept = {t.name: dataclasses.replace(t, keep_dtype=True) for t in info.unique()
            if t.spec.dtype == torch.float32 and any(pattern.search(a) for a in t.aliases)}
    if not kept:
        return info
    tensors = {name: kept.get(t.name, t) for name, t in info.tensors.items()}
    return dataclasses.replace(info, tensors=tensors)


def _declared(model: torch.nn.Module, attr: str) -> list[str]:
    out: list[str] = []
    done: set[type] = set()  # classes declaring nothing (on their modules' instances aside)
    for module in model.modules():
        if type(module) in done and attr not in vars(module):
            continue
        value = declared_attr(module, attr) or ()
        if not value and attr not in vars(module):
            done.add(type(module))
        out.extend(str(v) for v in value)
    return out


def quantized_input(source: object, ckpt: Checkpoint, info: ModelInfo | None,
                    model: object = None) -> bool:
    """Whether ``source`` (opened as ``ckpt``) or the model (``info``, ``model``) carries
    anything quantized (see the module docstring); ``False``: the quantized phases would
    find nothing. The configs are looked at first (a quantized checkpoint's names its
    format: one small read, not a pass over every entry), then the checkpoint (an FP8 one
    answers at its first weight)."""
    entries = ckpt.entries
    return (_config_next_to(source)
            or model_quantization_config(model) is not None
            or _any_fp8(map(_SPEC_DTYPE, entries.values()))
            or any(map(str.endswith, entries, repeat(SCALE_SUFFIXES)))
            or (info is not None and _any_fp8(map(_SPEC_DTYPE, info.tensors.values()))))


def model_quantization_config(model: object) -> object:
    """The ``quantization_config`` a model's ``config`` carries, as it is (``None``: none)."""
    config = getattr(model, "config", None)
    raw = getattr(config, "quantization_config", None)
    if raw is None and isinstance(config, Mapping):
        raw = config.get("quantization_config")
    return raw


def _any_fp8(dtypes: Iterable[torch.dtype]) -> bool:
    return any(map(_FP8.__contains__, dtypes))


def _config_next_to(source: object) -> bool:
    """A ModelOpt config, or a ``config.json`` that names a ``quantization_config``, in
    the checkpoint's directory (read as text: a plain config is not parsed; a
    :class:`DirectoryRead`'s, as its caller read it)."""
    if isinstance(source, DirectoryRead):
        return ("quantization_config" in json.dumps(source.config or {})
                or (source.directory / MODELOPT_CONFIG).is_file())
    if not isinstance(source, (str, Path)):
        return False
    path = Path(source)
    directory = path if path.is_dir() else path.parent
    config = directory / "config.json"
    try:
        text = config.read_text() if config.is_file() else ""
    except (OSError, ValueError):
        return True  # the phases read it again and report what is wrong with it
    return "quantization_config" in text or (directory / MODELOPT_CONFIG).is_file()


_FP8 = frozenset(FP8_DTYPES)
