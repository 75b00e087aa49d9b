"""What a plan says about the adapter it loads (its own section of the explanation)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScaleChange:
    """A LoRA layer the model scales differently from the adapter's training."""

    target: str  # the model's LoRA layer (a module path, or ``<experts>.<parameter>``)
    trained: float  # alpha / r (alpha / √r with rsLoRA) from ``adapter_config.json``
    model: float  # the injected layer's ``scaling``


@dataclass(frozen=True)
class LayoutConversion:
    """One layout change between the adapter's file and the model's LoRA tensors."""

    sources: tuple[str, ...]  # the per-expert linears' patterns in the file
    target: str  # the fused parameter (``gate_up_proj``)
    rank: tuple[int, int]  # file rank → model rank
    alpha: tuple[float, float]  # file alpha → the model's (scale · rank, or √rank)
    description: str


@dataclass(frozen=True)
class Replacement:
    """A base-layer tensor the adapter's file holds (peft's ``save_embedding_layers``: an
    embedding saved with the adapter, resized or not), loaded in place of the base's."""

    target: str  # the model tensor
    adapter_key: str  # its key in the adapter's file
    base_key: str  # the base checkpoint's key for it, not read


@dataclass(frozen=True)
class TrainableTokens:
    """peft's trainable tokens on one layer (``trainable_token_indices``): the trained rows'
    ``trainable_tokens_delta`` loads from the adapter's file; the base's rows at those
    indices (``trainable_tokens_original``, a non-persistent buffer peft takes from the
    base weight when it injects, to unmerge) are copied from the loaded base weight after
    the load."""

    layer: str  # the token adapter's path (``model.embed_tokens.token_adapter``)
    name: str  # the adapter name
    rows: tuple[int, ...]

    @property
    def base(self) -> str:
        return f"{self.layer}.base_layer.weight"

    @property
    def original(self) -> str:
        return f"{self.layer}.trainable_tokens_original.{self.name}"


@dataclass(frozen=True)
class AdapterSummary:
    """The adapter's part of a plan: type, rank, alpha, scale, targets, conversions, bytes."""

    directory: str
    name: str  # the adapter name in the model (peft's ``adapter_name``)
    peft_type: str
    r: int
    alpha: float
    scale: float
    use_rslora: bool
    use_dora: bool
    targets: tuple[str, ...]  # target_modules and target_parameters, as the config says
    modules_to_save: tuple[str, ...]
    file_tensors: int
    loaded_tensors: int
    read_bytes: int
    model_bytes: int
    conversions: tuple[LayoutConversion, ...] = ()
    scale_changes: tuple[ScaleChange, ...] = ()
    config_json: str = ""  # the adapter_config.json as read (written back when saving)
    merged: int = 0  # base weights the adapter is folded into (merge=True)
    replaced: tuple[Replacement, ...] = ()  # base tensors the adapter's file replaces
    # merged: (checkpoint key, the key a save writes it as) where a tie was split under the
    # name the checkpoint holds (the embedding's trained copy: it as the embedding, the
    # base's embedding as the lm_head that keeps it)
    renamed: tuple[tuple[str, str], ...] = ()
    # per-module ranks and alphas (peft's patterns, as the config gives them), and the
    # layers the targets are restricted to (layers_to_transform; () = every layer)
    rank_pattern: tuple[tuple[str, int], ...] = ()
    alpha_pattern: tuple[tuple[str, float], ...] = ()
    layers: tuple[int, ...] = ()
    tokens: tuple[TrainableTokens, ...] = ()

    def merged_as(self) -> dict[str, str]:
        """Merged: the adapter's key of each base tensor it replaced → the base's key, which
        a save of the merged model writes it as (and each ``renamed`` key)."""
        if not self.merged and not self.renamed:
            return {}
        return {**{r.adapter_key: r.base_key for r in self.replaced
                   if "," not in r.adapter_key + r.base_key}, **dict(self.renamed)}


CONFIGS_ATTRIBUTE = "_weightplan_adapter_configs"  # adapter name → its adapter_config.json


def remember_adapter(model: object, summary: AdapterSummary) -> None:
    """Keep a loaded adapter's config on the model (a plain attribute, not its state), to
    write it back when the adapter is saved."""
    configs = dict(getattr(model, CONFIGS_ATTRIBUTE, {}))
    configs[summary.name] = summary.config_json
    object.__setattr__(model, CONFIGS_ATTRIBUTE, configs)
