"""What the planner needs to know about a model: names, specs, ties, where tensors live."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from weightplan.planner.tensors.geometry import row_major_strides
from weightplan.planner.tensors.spec import TensorSpec


@dataclass(frozen=True, slots=True)
class ModelTensor:
    """One parameter or persistent buffer; tied tensors share one entry."""

    name: str  # canonical name: the first of ``aliases``
    spec: TensorSpec
    aliases: tuple[str, ...]
    is_buffer: bool
    on_meta: bool  # True: execute allocates it; False: bytes are written into its storage
    stride: tuple[int, ...]
    requires_grad: bool

    @property
    def allocates(self) -> bool:
        return self.on_meta


@dataclass(frozen=True)
class ModelInfo:
    """Metadata of a model's state (no tensor bytes are read)."""

    tensors: Mapping[str, ModelTensor]  # by every name, aliases included
    config: object | None = field(default=None, compare=False)
    class_name: str = ""
    model_type: str | None = None
    base_model_prefix: str | None = None
    meta_buffers: tuple[str, ...] = ()  # non-persistent buffers left on meta

    def get(self, name: str) -> ModelTensor | None:
        return self.tensors.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def unique(self) -> tuple[ModelTensor, ...]:
        seen: dict[str, ModelTensor] = {}
        for t in self.tensors.values():
            seen.setdefault(t.name, t)
        return tuple(seen.values())

    @property
    def nbytes(self) -> int:
        return sum(t.spec.nbytes for t in self.unique())


def inspect_model(model: torch.nn.Module) -> ModelInfo:
    """Collect parameter and persistent-buffer metadata, grouping tied tensors."""
    state = model.state_dict(keep_vars=True)
    buffers = {name for name, _ in model.named_buffers(remove_duplicate=False)}
    names_by_tensor: dict[int, list[str]] = {}
    tensors_by_id: dict[int, torch.Tensor] = {}
    for name, tensor in state.items():
        names_by_tensor.setdefault(id(tensor), []).append(name)
        tensors_by_id[id(tensor)] = tensor
    entries: dict[str, ModelTensor] = {}
    for ident, names in names_by_tensor.items():
        tensor = tensors_by_id[ident]
        entry = ModelTensor(
            name=names[0], spec=TensorSpec.of(tensor), aliases=tuple(names),
            is_buffer=names[0] in buffers, on_meta=tensor.is_meta,
            stride=row_major_strides(tuple(tensor.shape)) if tensor.is_meta else tuple(tensor.stride()),
            requires_grad=bool(getattr(tensor, "requires_grad", False)))
        for name in names:
            entries[name] = entry
    meta_buffers = tuple(name for name, b in model.named_buffers()
                         if b.is_meta and name not in state)
    config = getattr(model, "config", None)
    return ModelInfo(entries, config, type(model).__name__,
                     getattr(config, "model_type", None),
                     getattr(model, "base_model_prefix", None) or None, meta_buffers)
