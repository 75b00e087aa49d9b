"""The model's own initialization: who runs it, and what it can rebuild.

transformers models initialize through ``_init_weights(module)`` on their
``PreTrainedModel`` (each sub-model its own, the way ``initialize_weights`` dispatches).
It fills missing parameters with the model's init (ones for norms, std 0.02 normals) and
recomputes non-persistent buffers (rotary ``inv_freq``, ``position_ids``). Plain PyTorch
modules have ``reset_parameters()`` and nothing for buffers.

:func:`rebuildable` answers at plan time which meta buffers that init would write: it runs
the init of each buffer's module and its ancestors under a function mode that records
in-place writes to the model's own tensors and suppresses them, so the probe changes
nothing. Feature detection only (``_init_weights`` present), no transformers import.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

InitFn = Callable[[torch.nn.Module], None]


def declared_attr(module: torch.nn.Module, name: str) -> Any:
    """``getattr(module, name, None)`` for a plain attribute (set on the instance or its
    class), without ``nn.Module.__getattr__``: its failing lookup raises and formats an
    ``AttributeError`` for each of a big model's thousand modules that lacks ``name``."""
    if name in vars(module) or hasattr(type(module), name):
        return getattr(module, name, None)
    return None


def init_function(owner: torch.nn.Module) -> InitFn | None:
    """``owner._init_weights`` when ``owner`` is a model that initializes its modules."""
    fn = getattr(owner, "_init_weights", None)
    if callable(fn) and getattr(owner, "config", None) is not None:
        return fn
    return None


def init_chain(model: torch.nn.Module, path: str) -> list[tuple[torch.nn.Module, InitFn]]:
    """``(module, init)`` for the module at ``path`` and each ancestor, innermost first.

    Each module is initialized by its nearest enclosing model (a sub-model uses its own
    ``_init_weights``); modules with no initializing model above them are left out.
    """
    parts = path.split(".") if path else []
    modules = [model]
    for part in parts:
        modules.append(modules[-1].get_submodule(part))
    chain: list[tuple[torch.nn.Module, InitFn]] = []
    owner: InitFn | None = None
    for module in modules:
        owner = init_function(module) or owner
        if owner is not None:
            chain.append((module, owner))
    return chain[::-1]


def owner_name(fn: InitFn) -> str:
    return f"{type(getattr(fn, '__self__', fn)).__name__}._init_weights()"


class _WriteProbe(TorchFunctionMode):
    """Records in-place writes to the watched tensors and skips them."""

    def __init__(self, watched: dict[int, str]):
        super().__init__()
        self.watched = watched
        self.written: set[str] = set()

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        name = getattr(func, "__name__", "")
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes tensor=
        inplace = name == "__setitem__" or (name.endswith("_") and not name.startswith("_"))
        if inplace and isinstance(target, torch.Tensor) and id(target) in self.watched:
            self.written.add(self.watched[id(target)])
            return target
        return func(*args, **kwargs)


def rebuildable(model: torch.nn.Module, buffers: Iterable[str]) -> frozenset[str]:
    """The meta buffers among ``buffers`` the model's own init writes."""
    names = tuple(buffers)
    if not names:
        return frozenset()
    watched = {id(model.get_buffer(n)): n for n in names}
    probe = _WriteProbe(watched)
    paths = {n.rpartition(".")[0] for n in names}
    with torch.no_grad(), probe:
        for path in sorted(paths):
            for module, init in init_chain(model, path):
                try:
                    init(module)
                except Exception:  # an init that can't run on meta rebuilds nothing
                    continue
    return frozenset(probe.written)


def ignore_patterns(model: torch.nn.Module, buffers: Iterable[str] | None = None
                    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Regexes of keys the model declares ignorable: ``(missing, unexpected)``.

    transformers' ``_keys_to_ignore_on_load_missing`` / ``_unexpected`` of the model and
    its sub-models (searched anywhere in a key, as transformers does), plus the two it adds
    itself: old per-layer ``rotary_emb.inv_freq`` and persistent ``position_ids``.
    ``buffers``: the names ``model.named_buffers()`` gives, when the caller has them.
    """
    missing: set[str] = set()
    unexpected: set[str] = set()
    done: set[type] = set()  # classes whose patterns are in (a module's own ones aside)
    for module in model.modules():
        attrs = vars(module)
        own = _MISSING in attrs or _UNEXPECTED in attrs
        if not own and type(module) in done:
            continue
        missing.update(_patterns(module, _MISSING))
        unexpected.update(_patterns(module, _UNEXPECTED))
        if not own:
            done.add(type(module))
    if init_function(model) is not None:
        if buffers is None:
            buffers = [name for name, _ in model.named_buffers()]
        buffers = list(buffers)
        if any(b.endswith("rotary_emb.inv_freq") for b in buffers):
            unexpected.add(r"rotary_emb\.inv_freq")
        if any(b.endswith("position_ids") for b in buffers):
            unexpected.add(r"(^|\.)position_ids$")
    return tuple(sorted(missing)), tuple(sorted(unexpected))


_MISSING, _UNEXPECTED = "_keys_to_ignore_on_load_missing", "_keys_to_ignore_on_load_unexpected"


def _patterns(module: torch.nn.Module, attr: str) -> list[str]:
    value = getattr(type(module), attr, None) or declared_attr(module, attr) or ()
    if isinstance(value, str):
        value = (value,)
    out = []
    for pattern in value:
        try:
            re.compile(pattern)
        except (re.error, TypeError):
            continue
        out.append(pattern)
    return out


def matches(patterns: tuple[str, ...], key: str) -> str | None:
    """The first pattern found in ``key``, if any."""
    return next((p for p in patterns if re.search(p, key)), None)
