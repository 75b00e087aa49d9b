"""An empty transformers model for a Hugging Face checkpoint directory (``config.json``).

``weightplan explain CKPT_DIR`` uses it: the config is read with ``AutoConfig``, the class
named first in ``config.architectures`` that transformers has is built (else
``AutoModelForCausalLM``, else ``AutoModel``) under :func:`weightplan.init_empty`, so
parameters sit on ``meta`` and nothing is allocated. Every failure is a
:class:`ModelBuildError` saying what failed; remote code is never run (a config whose
``auto_map`` transformers would import is refused: :mod:`weightplan.bridge.config_guard`),
and a config asking for more layers or experts than :mod:`weightplan.limits` allows is
refused before the build.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from weightplan.errors import ModelBuildError
from weightplan.meta import init_empty


@dataclass(frozen=True)
class BuiltModel:
    """The model and what it was built from."""

    model: nn.Module
    config_path: Path
    class_name: str
    dtype: torch.dtype | None  # the config's dtype: what from_pretrained would use
    quantization: str | None = None  # what it holds quantized (``"FP8 128×128"``), if anything
    note: str | None = None  # why a model asked to keep its format doesn't (planned dequantized)


def config_path(checkpoint: str | Path) -> Path | None:
    """``config.json`` of a checkpoint directory (or next to a checkpoint file), if any."""
    path = Path(checkpoint)
    candidate = (path if path.is_dir() else path.parent) / "config.json"
    return candidate if candidate.is_file() else None


def build_empty_model(checkpoint: str | Path, *, attn_implementation: str | None = None,
                      experts_implementation: str | None = None, keep_quantized: bool = False,
                      dtype: torch.dtype | None = None, config_json: Mapping[str, object] | None = None,
                      model_class: Any = None, must_keep: bool = False, trust_remote_code: object = None,
                      overrides: Mapping[str, Any] | None = None) -> BuiltModel:
    """Build the model ``config.json`` describes, with its parameters on ``meta``
    (``attn_implementation`` / ``experts_implementation``: as transformers' keywords; ``overrides`` (``num_labels=3``):
    set as transformers' ``from_dict`` sets them; ``config_json``: the file as its caller read it, else read here once).
    ``keep_quantized``: when the config says the checkpoint is quantized in a format the
    model can hold (block FP8), build it with the quantized layers (serving's way:
    :mod:`weightplan.bridge.quantized`); else the plain one, loaded dequantized — also
    when the model class can't take the quantized layers (gpt-oss's biased experts), saying
    why in ``note``, unless ``must_keep`` (``dequantize=False``): then either is an error.
    ``dtype``: the load's, built under as transformers' ``from_pretrained`` builds (torch's
    default dtype set to it): what ``__init__`` makes in the default dtype (Gemma 3's
    ``embed_scale`` buffer) holds it, what it makes in float32 (rotary ``inv_freq``) stays;
    the meta tensors made in it are float32 again, as a float32 build gives them (the plan
    casts each to the load's dtype, keeping the ones the model keeps in float32).
    ``model_class``: the class built instead of ``architectures[0]``'s (:func:`given_class`);
    ``trust_remote_code``: as transformers' (what it would import: refused, ``config_guard``).

    Raises:
        ModelBuildError: there is no ``config.json``, transformers is not installed, or
            transformers can't read the config or build the class (the message says which).
        ArgumentError: a ``model_class`` that is no class for this config, or an override.
        QuantizationError: ``must_keep`` and the format is not one a model holds here.
    """
    path = config_path(checkpoint)
    if path is None:
        raise ModelBuildError(f"{checkpoint}: no config.json to build a model from; pass "
                              "--model-type to explain the checkpoint without a model")
    try:
        import transformers
    except ImportError as e:
        raise ModelBuildError(f"{path}: building a model needs transformers, which is not "
                              "installed (pip install transformers), or pass --model-type"
                              ) from e
    config = _read_config(transformers, path, config_json, trust_remote_code, model_class, overrides)
    if attn_implementation is not None:  # as from_pretrained(attn_implementation=...) does
        config._attn_implementation = attn_implementation
    if experts_implementation is not None:
        config._experts_implementation = experts_implementation
    cls, name = _model_class(transformers, config, path, model_class)
    def construct() -> nn.Module:
        return _construct(cls, name, config, path, dtype)

    model, held, note = construct(), None, None
    if keep_quantized or must_keep:
        model, held, note = _kept(model, construct, config, path, must_keep)
    return BuiltModel(model, path, type(model).__name__, _dtype(config), held, note)


def _kept(model: nn.Module, construct: Callable[[], nn.Module], config: Any, path: Path,
          must_keep: bool) -> tuple[nn.Module, str | None, str | None]:
    """``model`` holding its checkpoint's format, what it holds, and a note: a model class
    that can't take the quantized layers is built again plain (unless ``must_keep``)."""
    from weightplan.bridge.quantized import hold_quantized  # (asked to keep it quantized)

    try:
        return model, hold_quantized(model, config, path, must_keep), None
    except ModelBuildError as e:
        if must_keep:
            raise
        return construct(), None, (
            f"{e.args[0].split('; pass ')[0]}: planned dequantized (no option "
            "keeps this format in this model today; --dequantize or dequantize=True plans "
            "the same without this note)")


def _construct(cls: Any, name: str, config: Any, path: Path, dtype: torch.dtype | None
               ) -> nn.Module:
    """The model of ``config``, its parameters on meta (see :func:`build_empty_model`)."""
    try:
        with init_empty(), _default_dtype(dtype):
            model = (cls(config) if name != "auto"
                     else cls.from_config(config, trust_remote_code=False))
    except Exception as e:  # transformers raises anything from a model's __init__
        raise ModelBuildError(f"{path}: transformers can't build {type(config).__name__} "
                              f"into {getattr(cls, '__name__', cls)}: "
                              f"{type(e).__name__}: {e}") from e
    _meta_as_float32(model, dtype)
    return model


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    if dtype is None or not dtype.is_floating_point or dtype.itemsize < 2:
        yield
        return
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _meta_as_float32(model: nn.Module, dtype: torch.dtype | None) -> None:
    if dtype is None or dtype == torch.float32:
        return
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.is_meta and tensor.dtype == dtype:
            tensor.data = torch.empty(tensor.shape, dtype=torch.float32, device="meta")


def _read_config(transformers: Any, path: Path, read: Mapping[str, object] | None,
                 trust_remote_code: object = None, model_class: Any = None,
                 overrides: Mapping[str, Any] | None = None) -> Any:
    """transformers' config of ``path``, made from the file as read once (``read``, else
    read here): what ``AutoConfig.from_pretrained`` makes of the file's dict and
    ``overrides`` (refused where transformers would import the classes its ``auto_map``
    names instead; an override it has no attribute for: :class:`ArgumentError`)."""
    from weightplan.bridge.config_bounds import check_config_bounds
    from weightplan.bridge.config_guard import read_config_json, refuse_remote_code

    words = read_config_json(path) if read is None else dict(read)
    kind = words.get("model_type")
    built_in = isinstance(kind, str) and kind in _config_mapping(transformers)
    auto_class = (None if model_class is None else getattr(model_class, "__name__", "")
                  if getattr(model_class, "_model_mapping", None) is not None else "")
    refuse_remote_code(path, words, trust_remote_code=trust_remote_code, built_in=built_in,
                       auto_class=auto_class)  # (what transformers would import: refused)
    overrides = dict(overrides or {})
    check_config_bounds({**words, **overrides}, path)  # before any module is built
    try:
        config, unused = _auto_config(transformers, copy.deepcopy(words), path, overrides)
    except Exception as e:  # ValueError / KeyError / TypeError by version and config
        raise _unreadable(transformers, words, path, overrides, e) from e
    if unused:
        raise _not_config_words(unused, config, path)
    return config


def _unreadable(transformers: Any, words: dict, path: Path, overrides: dict[str, Any],
                error: Exception) -> Exception:
    """Why the config can't be read: the overrides' fault (an ``ArgumentError`` naming
    them) when the file alone reads, else the file's (a ``ModelBuildError``)."""
    from weightplan.errors import ArgumentError

    said = f"{type(error).__name__}: {error}"
    if overrides:
        try:
            _auto_config(transformers, copy.deepcopy(words), path, {})
        except Exception:  # (the file itself: said below)
            pass
        else:
            return ArgumentError(f"from_pretrained({', '.join(f'{k}=' for k in overrides)}...): "
                                 f"transformers' {words.get('model_type')} config ({path}) refuses "
                                 f"the override: {said}")
    return ModelBuildError(f"{path}: transformers can't read this config: {said}")


def _not_config_words(unused: Mapping[str, Any], config: Any, path: Path) -> Exception:
    """Why keywords the config has no attribute for are refused: transformers passes them
    to the model class's ``__init__``, which weightplan calls with the config only."""
    from weightplan.errors import ArgumentError

    def shown(value: Any) -> str:  # (a config's repr is its whole JSON: its type then)
        text = repr(value)
        return f"{type(value).__name__}(...)" if "\n" in text or len(text) > 60 else text

    words = ", ".join(f"{k}={shown(v)}" for k, v in unused.items())
    return ArgumentError(
        f"from_pretrained got {words}: not an attribute of {type(config).__name__} ({path}), "
        "so not a config override (transformers passes such a keyword to the model's "
        "__init__; weightplan builds the model from the config alone): set it on the config "
        "after loading, or build the model yourself and weightplan.load(model, path); "
        "weightplan's keywords are listed in help(weightplan.from_pretrained)")


def _auto_config(transformers: Any, words: dict, path: Path,
                 overrides: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The config class ``model_type`` names, made from ``words`` as ``AutoConfig`` makes
    it (a ``mistral`` config with ``layer_types`` is read as ``ministral`` there; floats
    JSON can't hold, written ``{"__float__": "Infinity"}``, decoded as its file reader
    decodes them); a config naming no ``model_type`` (or other files:
    ``configuration_files``) is left to ``AutoConfig``, which reads the file again. With the
    ``overrides`` the config has no attribute for (``return_unused_kwargs``)."""
    kind = words.get("model_type")
    if not isinstance(kind, str) or "configuration_files" in words:
        return transformers.AutoConfig.from_pretrained(
            str(path.parent), trust_remote_code=False, return_unused_kwargs=True, **overrides)
    if kind == "mistral" and "layer_types" in words:
        words["model_type"] = kind = "ministral"
    mapping = _config_mapping(transformers)
    if kind not in mapping:
        raise ValueError(f"model_type {kind!r} is not a model type this transformers "
                         f"{transformers.__version__} knows (pip install -U transformers)")
    cls = mapping[kind]
    decoded = getattr(cls, "_decode_special_floats", None)  # (transformers 5: inf, nan)
    return cls.from_dict(words if decoded is None else decoded(words),
                         name_or_path=str(path.parent), return_unused_kwargs=True, **overrides)


def _config_mapping(transformers: Any) -> Any:
    """transformers' config classes by ``model_type`` (those it has built in)."""
    return transformers.models.auto.configuration_auto.CONFIG_MAPPING


def _model_class(transformers: Any, config: Any, path: Path, given: Any) -> tuple[Any, str]:
    if given is not None:
        return given_class(given, config, path), "given"
    for name in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, name, None)
        if isinstance(cls, type) and issubclass(cls, nn.Module):
            return cls, name
    for auto in ("AutoModelForCausalLM", "AutoModel"):
        cls = getattr(transformers, auto)
        if type(config) in getattr(cls, "_model_mapping", {}):
            return cls, "auto"
    raise ModelBuildError(f"{path}: transformers has no model class for "
                          f"{type(config).__name__} (architectures: "
                          f"{getattr(config, 'architectures', None)})")


def given_class(wanted: Any, config: Any, path: Path) -> Any:
    """The class ``wanted`` builds for ``config``: an ``AutoModelFor*`` class's class for
    the config's type (as its ``from_pretrained`` picks it), or ``wanted`` itself when it is
    a model class whose ``config_class`` the config is.

    Raises:
        ArgumentError: ``wanted`` is neither, or has no class for this config.
    """
    from weightplan.errors import ArgumentError

    name, kind = getattr(wanted, "__name__", repr(wanted)), type(config).__name__
    mapping = getattr(wanted, "_model_mapping", None) if isinstance(wanted, type) else None
    if mapping is not None:  # an auto class
        try:
            return mapping[type(config)]
        except KeyError:
            raise ArgumentError(f"model_class={name}: transformers has no {name} class for "
                                f"{kind} ({path}); pick an auto class that has one, or leave "
                                "model_class out (the class config.json names)") from None
    if not (isinstance(wanted, type) and issubclass(wanted, nn.Module)):
        raise ArgumentError(f"model_class={wanted!r}: pass a class (transformers' "
                            "AutoModelForSequenceClassification, or LlamaForCausalLM), not "
                            f"a {type(wanted).__name__}")
    config_class = getattr(wanted, "config_class", None)
    if not (isinstance(config_class, type) and isinstance(config, config_class)):
        raise ArgumentError(f"model_class={name} is built from a "
                            f"{getattr(config_class, '__name__', config_class)}, and {path} "
                            f"holds a {kind}: pick a class of that config, or an auto class")
    return wanted


def _dtype(config: Any) -> torch.dtype | None:
    """The config's dtype when it names one (``"auto"`` and the like don't)."""
    from weightplan.errors import PlanError
    from weightplan.planner.core.spec import parse_dtype

    value = getattr(config, "dtype", None)
    try:
        return parse_dtype(value)
    except PlanError:
        return None
