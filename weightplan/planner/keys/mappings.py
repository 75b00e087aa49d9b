"""Built-in mappings for common checkpoint families (facts: transformers v5 §4.3).

Every family here is proven by an interop test against transformers' ``from_pretrained``
(``tests/interop/``). Families not listed still load through the transformers bridge
(:mod:`weightplan.bridge.transformers`) when the model is a transformers model.

* Experts, Mixtral layout: ``block_sparse_moe`` → ``mlp``; per-expert ``w1`` (gate),
  ``w3`` (up), ``w2`` (down) stacked into ``gate_up_proj`` / ``down_proj``.
* Experts, Qwen2-MoE layout: ``mlp.experts.N.{gate,up,down}_proj`` stacked the same way.
* Llava family: the composite's old flat layout (``language_model.model.*``,
  ``language_model.lm_head``, ``vision_tower.*`` at the top) moves under ``model.``.
  The root's ``model_type`` mapping moves the towers; the inner ``LlavaModel``-like
  class (found by class name, scoped to its path) drops the text model's own ``model.``.
  Every pattern is anchored, so keys already in the current layout are left alone.
* Vision towers saved with their old ``vision_model.`` level (CLIP, SigLIP) lose it.
"""

from __future__ import annotations

from collections.abc import Iterable

from weightplan.planner.core.ops.joins import Concatenate, MergeModulelist
from weightplan.planner.keys.registry import MappingRegistry
from weightplan.planner.keys.transforms import (
    PrefixChange, WeightConverter, WeightRenaming, WeightTransform,
)

MIXTRAL_ALIASES = ("minimax",)
QWEN2_MOE_ALIASES = ("qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3")
LLAVA_ALIASES = ("paligemma", "gemma3", "mistral3")  # model_type → "llava"
LLAVA_MODEL_ALIASES = ("PaliGemmaModel", "Gemma3Model", "Mistral3Model")  # class → "LlavaModel"
VISION_TOWER_ALIASES = ("SiglipVisionModel",)  # class → "CLIPVisionModel"


def _fused_experts(gate: str, up: str, down: str, prefix: str) -> list[WeightConverter]:
    """Per-expert gate/up/down linears → stacked ``gate_up_proj`` and ``down_proj``."""
    return [
        WeightConverter([f"{prefix}.*.{gate}.weight", f"{prefix}.*.{up}.weight"],
                        f"{prefix}.gate_up_proj", [MergeModulelist(0), Concatenate(1)]),
        WeightConverter(f"{prefix}.*.{down}.weight", f"{prefix}.down_proj",
                        [MergeModulelist(0)]),
    ]


def _llava_root(*parts: str) -> list[WeightRenaming]:
    """The composite's top-level parts move under ``model.``; the text head goes to the top."""
    return [WeightRenaming(r"^language_model\.lm_head\.", "lm_head."),
            *(WeightRenaming(rf"^{part}(?=\.|$)", f"model.{part}")
              for part in ("language_model", *parts))]


def register_builtins(registry: MappingRegistry) -> None:
    """Register the built-in families and their aliases into ``registry``."""
    registry.register("mixtral", [WeightRenaming(".block_sparse_moe.", ".mlp."),
                                  *_fused_experts("w1", "w3", "w2", ".experts")])
    registry.register("qwen2_moe", _fused_experts("gate_proj", "up_proj", "down_proj",
                                                  "mlp.experts"))
    registry.register("llava", _llava_root("vision_tower", "multi_modal_projector"))
    registry.register("LlavaModel", [WeightRenaming(r"^language_model\.model\.",
                                                     "language_model.")])
    registry.register("CLIPVisionModel", [PrefixChange(prefix_to_remove="vision_model")])
    for base, aliases in (("mixtral", MIXTRAL_ALIASES), ("qwen2_moe", QWEN2_MOE_ALIASES),
                          ("llava", LLAVA_ALIASES), ("LlavaModel", LLAVA_MODEL_ALIASES),
                          ("CLIPVisionModel", VISION_TOWER_ALIASES)):
        for alias in aliases:
            registry.alias(alias, base)


REGISTRY = MappingRegistry()  # the process's registry: the built-ins, then the user's
register_builtins(REGISTRY)


def register_mapping(key: str, transforms: Iterable[WeightTransform], overwrite: bool = False
                     ) -> None:
    """Register ``transforms`` under a ``model_type`` or class name.

    Raises:
        RegistryError: ``key`` is already registered and ``overwrite`` is false.

    Example:
        >>> register_mapping("my_moe", [WeightRenaming(".moe.", ".mlp.")])  # doctest: +SKIP
    """
    REGISTRY.register(key, transforms, overwrite=overwrite)


def get_mapping(key: str) -> list[WeightTransform]:
    """The transforms registered under ``key`` (aliases followed), as a new list."""
    return REGISTRY.get(key)


def register_alias(alias: str, key: str, overwrite: bool = False) -> None:
    """Make ``alias`` resolve to the mapping registered under ``key``."""
    REGISTRY.alias(alias, key, overwrite=overwrite)
