"""Built-in mappings for common checkpoint families (facts: transformers v5 §4.3)."""

from __future__ import annotations

from weightplan.planner.ops import Concatenate, MergeModulelist
from weightplan.planner.registry import MappingRegistry
from weightplan.planner.transforms import WeightConverter, WeightRenaming


def _fused_experts(gate: str, up: str, down: str, prefix: str) -> list[WeightConverter]:
    """Per-expert gate/up/down linears → stacked ``gate_up_proj`` and ``down_proj``."""
    return [
        WeightConverter([f"{prefix}.*.{gate}.weight", f"{prefix}.*.{up}.weight"],
                        f"{prefix}.gate_up_proj", [MergeModulelist(0), Concatenate(1)]),
        WeightConverter(f"{prefix}.*.{down}.weight", f"{prefix}.down_proj",
                        [MergeModulelist(0)]),
    ]


def register_builtins(registry: MappingRegistry) -> None:
    # Mixtral: block_sparse_moe → mlp; experts w1 (gate), w3 (up), w2 (down).
    registry.register("mixtral", [WeightRenaming(".block_sparse_moe.", ".mlp."),
                                  *_fused_experts("w1", "w3", "w2", ".experts")])
    registry.alias("minimax", "mixtral")
    # Qwen2-MoE layout: mlp.experts.N.{gate,up,down}_proj.
    registry.register("qwen2_moe", _fused_experts("gate_proj", "up_proj", "down_proj",
                                                  "mlp.experts"))
    for alias in ("qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3"):
        registry.alias(alias, "qwen2_moe")
