"""Mappings by name: weightplan's registry first, then every family the transformers
bridge translates (by ``model_type`` or class name), then any other transformers
``model_type`` (loaded without conversion: ``llama``; one whose classes transformers converts
by class name, ``qwen2_vl``, is a :class:`RegistryError` naming them); a typo gets the
closest names.

``--model-type phimoe``, ``convert --model-type llama`` and ``explain(mapping="phimoe")``
all go through :func:`named_choice`; ``weightplan mappings`` lists both kinds.
"""

from __future__ import annotations

import difflib

from weightplan.errors import RegistryError
from weightplan.planner.keys.mappings import REGISTRY
from weightplan.planner.keys.registry import MappingChoice, MappingRegistry
from weightplan.units import counted


def bridged_names() -> list[str]:
    """Every name the transformers bridge has a mapping for (empty without transformers)."""
    try:
        from weightplan.bridge.transformers import registered_keys

        return registered_keys()
    except ImportError:
        return []


def _model_types() -> frozenset[str]:
    """Every ``model_type`` transformers knows (most need no conversion at all)."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        return frozenset()
    return frozenset(CONFIG_MAPPING_NAMES)


def _converting_classes(model_type: str) -> list[str]:
    """The model classes of ``model_type`` (transformers' auto tables) that the bridge has a
    mapping for by class name."""
    from transformers.models.auto import modeling_auto

    bridged = set(bridged_names())
    found: set[str] = set()
    for table in (getattr(modeling_auto, n) for n in dir(modeling_auto)
                  if n.endswith("_MAPPING_NAMES")):
        classes = table.get(model_type, ()) if hasattr(table, "get") else ()
        found.update(c for c in ((classes,) if isinstance(classes, str) else classes)
                     if c in bridged)
    return sorted(found)


def named_choice(name: str, registry: MappingRegistry = REGISTRY, *,
                 why: str = "requested mapping") -> MappingChoice:
    """The transforms registered (or bridged) under ``name``; ``why``: how the name was
    chosen, for the plan's ``mapping:`` line.

    Raises:
        RegistryError: no such name; the message lists the closest known names.
    """
    if name in registry:
        return MappingChoice(name, f"{why} {name!r}", tuple(registry.get(name)))
    bridged = _bridged(name)
    if bridged is not None:
        return bridged
    if name in _model_types():
        classes = _converting_classes(name)
        if classes:
            raise RegistryError(f"transformers has no mapping for model_type {name!r} itself: it "
                                f"converts that family's checkpoints by class, and the class "
                                f"decides the layout; pass one of {', '.join(classes)}")
        return MappingChoice(name, f"model_type {name!r} via the transformers bridge: "
                                   "transformers loads it without conversion", ())
    known = sorted({*registry.keys(), *bridged_names(), *_model_types()})
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see `weightplan mappings`"
    raise RegistryError(f"no mapping registered for {name!r}, neither in weightplan nor in "
                        f"transformers; {hint}")


def class_choice(name: str, registry: MappingRegistry = REGISTRY) -> MappingChoice | None:
    """The mapping registered (or bridged) under the class name ``name`` of a config.json's
    ``architectures``, or ``None``."""
    why = "config.json's architectures"
    if name in registry:
        return MappingChoice(name, f"{why} {name!r}", tuple(registry.get(name)))
    return _bridged(name, why)


def _bridged(name: str, why: str | None = None) -> MappingChoice | None:
    """transformers' mapping for ``name``, said to be ``why``'s (else: the model_type's, or
    the class's for a name that is no model_type)."""
    try:
        from weightplan.bridge.transformers import translate_mapping

        translation = translate_mapping(name)
    except ImportError:
        return None
    if translation is None:
        return None
    left_out = f"; {counted(len(translation.problems), 'part')} left out: {', '.join(translation.gaps)}" \
        if translation.problems else ""
    what = why or ("model_type" if name in _model_types() else "class")
    return MappingChoice(name, f"{what} {name!r} via the transformers bridge{left_out}",
                         translation.transforms)
