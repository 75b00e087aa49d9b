"""What the planner needs to know about a model: names, specs, ties, where tensors live.

Ties a model declares count whether or not its tensors are still the same object.
A transformers model ties ``lm_head.weight`` to the input embeddings in ``post_init`` by
assigning one parameter to two modules. Building under accelerate's
``init_empty_weights()`` breaks that: its ``register_parameter`` hook gives the second
module a fresh meta parameter. The declaration survives, so the planner reads it and groups
the names again (one tensor, two names), exactly as ``from_pretrained`` ties after loading.

transformers 5.x declares ties as ``_tied_weights_keys = {target: source}`` (regexes or
module names allowed), expanded by ``get_expanded_tied_weights_keys(all_submodels=True)``;
this module uses that method when it exists and the plain dict otherwise (feature detection,
no version pins). Models without a declaration have no ties beyond shared objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch

from weightplan.planner.inputs.model_init import ignore_patterns, matches, rebuildable
from weightplan.planner.core.geometry import row_major_strides
from weightplan.planner.core.makers import columns
from weightplan.planner.core.spec import TensorSpec


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
    keep_dtype: bool = False  # the model keeps it in its dtype whatever dtype is asked
    untied: bool = False  # a tie's name the checkpoint stores apart: allocated on its own

    @property
    def allocates(self) -> bool:
        return self.on_meta


_model_tensors = columns(ModelTensor)  # (a model's tensors, in one pass per field)


@dataclass(frozen=True)
class ModelInfo:
    """Metadata of a model's state (no tensor bytes are read)."""

    tensors: Mapping[str, ModelTensor]  # by every name, aliases included
    config: object | None = field(default=None, compare=False)
    class_name: str = ""
    model_type: str | None = None
    base_model_prefix: str | None = None
    meta_buffers: tuple[str, ...] = ()  # non-persistent buffers left on meta
    rebuilt_buffers: frozenset[str] = frozenset()  # those the model's own init rebuilds
    declared_ties: tuple[tuple[str, ...], ...] = ()  # groups re-tied from the declaration
    ignore_missing: tuple[str, ...] = ()  # regexes of keys the model declares ignorable
    ignore_unexpected: tuple[str, ...] = ()
    tied_names: tuple[str, ...] = ()  # the names of declared ties held as one tensor
    # (kept name, name) of each tie the checkpoint stores both sides of: loaded apart
    # (:func:`untie`), tied again after the load when their values are equal
    stored_ties: tuple[tuple[str, str], ...] = ()

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

    def every_name(self, missing: Iterable[str]) -> set[str]:
        """Each of ``missing``'s tensors under every name it has that the model does not
        declare ignorable: transformers' ``missing_keys`` names a tie none of whose names
        loaded under each of them (a masked LM's ``cls.predictions.bias`` and the decoder's
        bias tied to it)."""
        names = set()
        for key in missing:
            tensor = self.tensors.get(key)
            names.add(key)
            names.update(a for a in (tensor.aliases if tensor else ())
                         if not matches(self.ignore_missing, a))
        return names


def inspect_model(model: torch.nn.Module) -> ModelInfo:
    """Collect parameter and persistent-buffer metadata, grouping tied tensors.

    Tensors tie when they are one object, and when the model declares the tie (see
    :mod:`.ties`) even if the build convention gave them separate meta tensors.
    """
    state = model.state_dict(keep_vars=True)
    every_buffer = list(model.named_buffers(remove_duplicate=False))
    buffers = {name for name, _ in every_buffer}
    groups, retied, tied = _groups(model, state)
    specs: dict[tuple[tuple[int, ...], torch.dtype], TensorSpec] = {}
    rows = []  # (each tensor's fields; made in columns below)
    for names in groups:
        tensor = state[names[0]]
        shape, on_meta, dtype = tuple(tensor.shape), tensor.is_meta, tensor.dtype
        spec = specs.get((shape, dtype))  # (one spec per shape and dtype: a frontier
        if spec is None:  # model's 90k tensors are a few hundred)
            spec = specs[(shape, dtype)] = TensorSpec(shape, dtype)
        rows.append((names[0], spec, tuple(names), names[0] in buffers, on_meta,
                     row_major_strides(spec.shape) if on_meta else tuple(tensor.stride()),
                     bool(getattr(tensor, "requires_grad", False)), False, False))
    made = _model_tensors(len(rows), *zip(*rows, strict=True)) if rows else []
    entries: dict[str, ModelTensor] = {}
    for names, entry in zip(groups, made, strict=True):
        for name in names:
            entries[name] = entry
    named_buffers = _first_each(every_buffer)  # (model.named_buffers(), one walk fewer)
    meta_buffers = tuple(name for name, b in named_buffers if b.is_meta and name not in state)
    config = getattr(model, "config", None)
    missing, unexpected = ignore_patterns(model, [name for name, _ in named_buffers])
    return ModelInfo(entries, config, type(model).__name__,
                     getattr(config, "model_type", None),
                     getattr(model, "base_model_prefix", None) or None, meta_buffers,
                     rebuildable(model, meta_buffers), retied, missing, unexpected, tied)


def _first_each(named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Each tensor of ``named`` (a walk that keeps duplicates) at its first name: what the
    deduplicating walk gives (it skips only what it met before, so it meets each tensor
    first where the other walk does)."""
    seen: set[int] = set()
    firsts = []
    for name, tensor in named:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            firsts.append((name, tensor))
    return firsts


def restrict_model(info: ModelInfo, keep: Callable[[str], bool]) -> ModelInfo:
    """``info`` with only the tensors ``keep`` accepts (by canonical name): a load of part
    of a model (an adapter) neither writes nor reports the rest."""
    tensors = {name: t for name, t in info.tensors.items() if keep(t.name)}
    return dataclasses.replace(info, tensors=tensors)


def keep_dtype_of(info: ModelInfo, keep: Callable[[str], bool]) -> ModelInfo:
    """``info`` with the tensors ``keep`` accepts kept in their dtype whatever is asked (a
    LoRA adapter's weights stay float32 on a bf16 base, as peft keeps them)."""
    tensors = {name: dataclasses.replace(t, keep_dtype=True) if keep(t.name) else t
               for name, t in info.tensors.items()}
    return dataclasses.replace(info, tensors=tensors)


def untie(info: ModelInfo, pairs: tuple[tuple[str, str], ...]) -> ModelInfo:
    """``info`` with the second name of each ``(kept, name)`` pair a tensor of its own,
    which the load allocates (whatever the tensor it shared is: on meta or real), no
    longer an alias of ``kept``'s; ``stored_ties`` records the pairs."""
    tensors = dict(info.tensors)
    for _, name in pairs:
        t = tensors[name]
        rest = tuple(a for a in t.aliases if a != name)
        kept = dataclasses.replace(t, name=rest[0] if t.name == name else t.name, aliases=rest)
        tensors.update(dict.fromkeys(kept.aliases, kept))
        tensors[name] = dataclasses.replace(t, name=name, aliases=(name,), on_meta=True,
                                            stride=row_major_strides(t.spec.shape), untied=True)
    return dataclasses.replace(info, tensors=tensors, stored_ties=info.stored_ties + pairs)


def _groups(model: torch.nn.Module, state: Mapping[str, torch.Tensor]
            ) -> tuple[list[list[str]], tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """Names by tensor object, then declared ties merged where both sides are on meta
    (and the declared ties' names held as one tensor: those transformers compares when
    the checkpoint stores both)."""
    by_id: dict[int, list[str]] = {}
    for name, tensor in state.items():
        by_id.setdefault(id(tensor), []).append(name)
    group_of = {name: names for names in by_id.values() for name in names}
    retied, declared = [], dict[str, None]()
    for tie in tie_groups(model, set(state)):
        declared.update(dict.fromkeys(tie))
        source = group_of[tie[0]]
        for target in tie[1:]:
            other = group_of[target]
            if other is source or not _tieable(state[tie[0]], state[target]):
                continue
            source.extend(other)
            for name in other:
                group_of[name] = source
            other.clear()
            retied.append((tie[0], target))
    return ([g for g in by_id.values() if g], tuple(retied),
            tuple(n for n in declared if len(group_of[n]) > 1))


def _tieable(source: torch.Tensor, target: torch.Tensor) -> bool:
    return (target.is_meta and source.is_meta and source.shape == target.shape
            and source.dtype == target.dtype)


def declared_ties(model: torch.nn.Module) -> dict[str, str]:
    """``{tied name: source name}`` the model declares (empty when it declares none)."""
    expand = getattr(model, "get_expanded_tied_weights_keys", None)
    if callable(expand):
        try:
            return dict(expand(all_submodels=True))
        except Exception:  # a custom declaration transformers itself can't expand
            return {}
    return _plain_declaration(model)


def _plain_declaration(model: torch.nn.Module) -> dict[str, str]:
    config = getattr(model, "config", None)
    keys = getattr(model, "_tied_weights_keys", None)
    if not isinstance(keys, dict) or not getattr(config, "tie_word_embeddings", False):
        return {}
    return {str(k): str(v) for k, v in keys.items()}


def tie_groups(model: torch.nn.Module, names: set[str]) -> list[tuple[str, ...]]:
    """Declared ties as groups of names (source first), limited to names the model has."""
    groups: dict[str, list[str]] = {}
    for target, source in declared_ties(model).items():
        if target in names and source in names and target != source:
            groups.setdefault(source, [source]).append(target)
    return [tuple(g) for g in groups.values()]
