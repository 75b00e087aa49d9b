"""Build models without allocating their parameters."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

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
        registered = module._parameters[name]
        if param is not None and registered is not None and not param.is_meta:
            kind: Any = type(registered)
            kwargs = dict(registered.__dict__)
            kwargs["requires_grad"] = param.requires_grad
            module._parameters[name] = kind(registered.to("meta"), **kwargs)

    setattr(nn.Module, "register_parameter", register_on_meta)  # noqa: B010 (patching a method)
    try:
        yield
    finally:
        setattr(nn.Module, "register_parameter", original)  # noqa: B010
