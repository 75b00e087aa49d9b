"""Mappings by name: weightplan's registry first, then every family the transformers
bridge translates (by ``model_type`` or class name), then any other transformers
``model_type`` (loaded without conversion: ``llama``); a typo gets the closest names.

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
        return MappingChoice(name, f"model_type {name!r} via the transformers bridge: "
                                   "transformers loads it without conversion", ())
    known = sorted({*registry.keys(), *bridged_names(), *_model_types()})
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see `weightplan mappings`"
    raise RegistryError(f"no mapping registered for {name!r}, neither in weightplan nor in "
                        f"transformers; {hint}")


def _bridged(name: str) -> MappingChoice | None:
    try:
        from weightplan.bridge.transformers import translate_mapping

        translation = translate_mapping(name)
    except ImportError:
        return None
    if translation is None:
        return None
    left_out = f"; {counted(len(translation.problems), 'part')} left out: {', '.join(translation.gaps)}" \
        if translation.problems else ""
    return MappingChoice(name, f"model_type {name!r} via the transformers bridge{left_out}",
                         translation.transforms)
