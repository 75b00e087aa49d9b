"""Build models without allocating their parameters."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def init_empty(include_buffers: bool = False) -> Iterator[None]:
    """Create parameters on the ``meta`` device while the block runs.

    Buffers stay real by default: non-persistent ones (rotary ``inv_freq`` and the like)
    are computed in ``__init__`` and no checkpoint holds them.

    Example:
        >>> with init_empty():                    # doctest: +SKIP
        ...     model = MyModel(config)
        >>> weightplan.load(model, "ckpt/")       # doctest: +SKIP
    """
    if include_buffers:
        with torch.device("meta"):
            yield
        return
    original = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and not param.is_meta:
            kind = type(module._parameters[name])
            kwargs = dict(module._parameters[name].__dict__)
            kwargs["requires_grad"] = param.requires_grad
            module._parameters[name] = kind(module._parameters[name].to("meta"), **kwargs)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = original
