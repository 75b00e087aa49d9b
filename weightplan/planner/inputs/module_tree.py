"""The model's module tree as automatic placement sees it: which tensors each module holds
directly, its children, and which modules may not be split across devices.

A module is *whole* (never split) when its class is one of the model's ``_no_split_modules``
(transformers' declaration: a block with a residual connection must run on one device)
or when it has no child modules. Nothing is allocated: shapes and dtypes are read off the
(meta) tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ModuleNode:
    """One module: its direct tensors (full names) and its children (full names)."""

    name: str
    class_name: str
    tensors: tuple[str, ...]
    children: tuple[str, ...]
    whole: bool  # never split across devices


@dataclass(frozen=True)
class ModuleTree:
    """Every module by name (``""``: the root), and the sizes of tensors the model state
    doesn't list (non-persistent buffers: they live on the device all the same)."""

    modules: Mapping[str, ModuleNode]
    no_split: tuple[str, ...]  # the class names declared never split
    extra_bytes: Mapping[str, int]  # non-persistent buffers: name → bytes

    def node(self, name: str) -> ModuleNode:
        return self.modules[name]


def no_split_classes(model: torch.nn.Module) -> tuple[str, ...]:
    """The union of every submodule's ``_no_split_modules`` (transformers collects them from
    each pretrained submodule the same way), sorted."""
    found: set[str] = set()
    for module in model.modules():
        declared = getattr(module, "_no_split_modules", None)
        if isinstance(declared, (list, tuple, set, frozenset)):
            found.update(c for c in declared if isinstance(c, str))
    return tuple(sorted(found))


def module_tree(model: torch.nn.Module, no_split: Iterable[str] | None = None) -> ModuleTree:
    """``model``'s tree; ``no_split`` overrides the classes read from the model."""
    classes = tuple(sorted(no_split)) if no_split is not None else no_split_classes(model)
    wanted = frozenset(classes)
    nodes: dict[str, ModuleNode] = {}
    extra: dict[str, int] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if name in nodes:
            continue
        prefix = f"{name}." if name else ""
        persistent = set(module._buffers) - set(getattr(module, "_non_persistent_buffers_set",
                                                        ()))
        tensors = [prefix + n for n, p in module._parameters.items() if p is not None]
        for n, b in module._buffers.items():
            if b is None:
                continue
            tensors.append(prefix + n)
            if n not in persistent:
                extra[prefix + n] = b.numel() * b.element_size()
        children = tuple(prefix + n for n, c in module._modules.items() if c is not None)
        cls = type(module).__name__
        nodes[name] = ModuleNode(name, cls, tuple(tensors), children,
                                 whole=not children or cls in wanted)
    return ModuleTree(nodes, classes, extra)


def subtree_tensors(tree: ModuleTree, name: str) -> list[str]:
    """Every tensor name under module ``name`` (its own, then its children's, depth first)."""
    out: list[str] = []
    stack = [name]
    while stack:
        node = tree.modules[stack.pop()]
        out += node.tensors
        stack += reversed(node.children)
    return out


def owner(name: str, modules: Mapping[str, object]) -> str:
    """The module holding tensor ``name`` (the longest module name that prefixes it)."""
    path = name.rpartition(".")[0]
    while path and path not in modules:
        path = path.rpartition(".")[0]
    return path
