"""Build models without allocating their parameters.

:func:`init_empty` creates every sized tensor (``torch.empty``, ``zeros``, ``ones``,
``full``, ``rand``, ``randn``, ... of more than 64 Ki elements) on ``meta`` while the
block runs, and moves smaller parameters to meta as they are registered: no parameter
memory is kept, nothing big is ever allocated, and in-place init of meta tensors (random
or constant) is skipped. Building costs about what ``torch.device("meta")`` costs.
Buffers stay real, as a load needs them (no checkpoint holds a rotary ``inv_freq``):
tensors built from values (``arange``, ``tensor``, ``linspace``, ...) and small ones are
real, and a big sized tensor registered as a buffer is created again, for real, from the
same call. A buffer computed from a big meta tensor stays on meta; ``explain`` then says
whether the model's own init rebuilds it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

# constructors whose size, not their values, is the input: these go to meta
SIZED = frozenset({"empty", "zeros", "ones", "full", "rand", "randn", "randint", "randperm",
                   "empty_strided", "empty_permuted", "normal", "eye"})

SMALL = 1 << 16  # elements: smaller tensors are made for real (masks, tables: cheap)


def _numel(name: str, args: tuple, kwargs: dict) -> float:
    """Elements a sized constructor makes (infinite when the call can't be read)."""
    if name in ("randint", "normal"):
        size = kwargs.get("size", args[-1] if args else None)
    elif name in ("eye", "randperm"):
        size = [a for a in args if isinstance(a, int)] or None
        if name == "eye" and size is not None and len(size) == 1:
            size = size * 2  # eye(n) is n × n
    else:
        size = kwargs.get("size", args[0] if len(args) == 1 or name == "full" else args)
    if isinstance(size, int):
        size = (size,)
    if not isinstance(size, (tuple, list, torch.Size)) or \
            not all(isinstance(n, int) for n in size):
        return float("inf")
    return float(math.prod(size))


# calls whose result is the same tensor again, as far as a buffer's value goes
KEEPS = frozenset({"detach", "requires_grad_", "contiguous", "clone"})

# in-place calls that change only values (random and constant init): no-ops on meta
VALUE_ONLY = frozenset({
    "normal_", "uniform_", "zero_", "fill_", "copy_", "constant_", "ones_", "zeros_", "eye_",
    "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
    "trunc_normal_", "orthogonal_", "sparse_", "exponential_", "log_normal_", "random_",
    "bernoulli_", "cauchy_", "geometric_", "erfinv_", "clamp_", "mul_", "add_", "sub_", "div_",
    "masked_fill_", "index_fill_", "lecun_normal_", "default_flax_embed_init_"})


class _SizedOnMeta(TorchFunctionMode):
    """Sized constructors without a device go to meta; the call is kept for buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.recipes: dict[int, tuple[Any, tuple[Any, ...], dict[str, Any], torch.Tensor]] = {}

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        target = args[0] if args else kwargs.get("tensor")
        if name in VALUE_ONLY and isinstance(target, torch.Tensor) and target.is_meta:
            return target  # in-place init of a meta tensor does nothing: skip its cost
        public: Any = getattr(torch, name, None)  # the torch.* constructor, not a method
        if name in SIZED and kwargs.get("device") is None \
                and public is func and _numel(name, args, kwargs) > SMALL:
            tensor = func(*args, **{**kwargs, "device": "meta"})
            self.recipes[id(tensor)] = (func, args, kwargs, tensor)  # tensor: keeps id unique
            return tensor
        result = func(*args, **kwargs)
        if getattr(func, "__name__", "") in KEEPS and args and id(args[0]) in self.recipes:
            recipe = self.recipes[id(args[0])]  # nn.Buffer(t) is t.detach(): same recipe
            if recipe[3] is args[0] and isinstance(result, torch.Tensor):
                self.recipes[id(result)] = (*recipe[:3], result)
        return result

    def realize(self, tensor: torch.Tensor) -> torch.Tensor:
        """The real tensor ``tensor``'s constructor call gives, if it came from one."""
        recipe = self.recipes.get(id(tensor))
        if recipe is None or recipe[3] is not tensor:
            return tensor
        func, args, kwargs, _ = recipe
        real = func(*args, **kwargs, device="cpu") if "device" not in kwargs else func(*args, **kwargs)
        return real.requires_grad_(tensor.requires_grad) if real.is_floating_point() else real


@contextlib.contextmanager
def init_empty(include_buffers: bool = False) -> Iterator[None]:
    """Create parameters on the ``meta`` device while the block runs, allocating nothing.

    Buffers stay real by default: non-persistent ones (rotary ``inv_freq`` and the like)
    are computed in ``__init__`` and no checkpoint holds them. ``include_buffers=True``
    puts everything on meta (``torch.device("meta")``).

    Example:
        >>> with init_empty():                    # doctest: +SKIP
        ...     model = MyModel(config)
        >>> weightplan.load(model, "ckpt/")       # doctest: +SKIP
    """
    if include_buffers:
        with torch.device("meta"):
            yield
        return
    mode = _SizedOnMeta()
    original_param, original_buffer = nn.Module.register_parameter, nn.Module.register_buffer

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original_param(module, name, param)
        registered = module._parameters[name]
        if param is not None and registered is not None and not param.is_meta:
            kind: Any = type(registered)
            kwargs = dict(registered.__dict__)
            kwargs["requires_grad"] = param.requires_grad
            module._parameters[name] = kind(registered.to("meta"), **kwargs)

    def register_real(module: nn.Module, name: str, tensor: torch.Tensor | None,
                      persistent: bool = True) -> None:
        if isinstance(tensor, torch.Tensor) and tensor.is_meta:
            tensor = mode.realize(tensor)
        original_buffer(module, name, tensor, persistent)

    setattr(nn.Module, "register_parameter", register_on_meta)  # noqa: B010 (patching a method)
    setattr(nn.Module, "register_buffer", register_real)  # noqa: B010
    try:
        with mode:
            yield
    finally:
        setattr(nn.Module, "register_parameter", original_param)  # noqa: B010
        setattr(nn.Module, "register_buffer", original_buffer)  # noqa: B010
        mode.recipes.clear()
