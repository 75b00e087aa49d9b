"""``explain_adapter_layout_save``: an injected adapter written in a layout chosen by the
caller, whatever layout it was loaded from: ``"per_expert"`` (transformers v4's linears,
each fused factor unpacked: ``lora_A`` split along the rank, ``lora_B``'s diagonal blocks
taken out) or ``"fused"`` (the model's tensors as peft saves them).

The adapter's transforms (:func:`~weightplan.planner.keys.adapter_keys.layout_transforms`)
are inverted, as for a model never loaded by weightplan; the bytes are copied, never
recomputed, so either way is exact. A fused ``lora_B`` whose blocks off the diagonal are
not zero has no per-expert form: the plan refuses it by name.
"""

from __future__ import annotations

import os

import torch

from weightplan.errors import SaveError
from weightplan.planner.core.ops.blocks import off_diagonal_zero
from weightplan.planner.inputs.adapter import WEIGHTS_FILE
from weightplan.planner.inputs.adapter_model import PEFT_PREFIX, InjectedAdapter, inspect_adapter
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.keys.adapter_keys import fused_targets, layout_transforms
from weightplan.planner.keys.registry import MappingChoice
from weightplan.planner.pipelines.save import build, make_write_plan
from weightplan.planner.pipelines.write_plan import Inversion, WritePlanData
from weightplan.units import agreeing, counted
from weightplan.planner.write.reverse import derived_groups

LAYOUTS = ("per_expert", "fused")


def explain_adapter_layout_save(model: torch.nn.Module, directory: str | os.PathLike[str],
                                base: MappingChoice, *, name: str = "default",
                                layout: str = "fused", modules_to_save: tuple[str, ...] = (),
                                overwrite: bool = False, threads: int = 4) -> WritePlanData:
    """Plan writing adapter ``name`` of ``model`` to ``directory`` in ``layout``; ``base``:
    the base model's mapping (its per-expert names and fused converters).

    Raises:
        SaveError: an unknown layout, no such adapter, tensors on meta, or a fused
            ``lora_B`` with values off its diagonal blocks (per-expert, naming it).
    """
    if layout not in LAYOUTS:
        raise SaveError(f"layout={layout!r}: use one of {', '.join(map(repr, LAYOUTS))}")
    injected = inspect_adapter(model, name)
    if not injected.layers and not injected.saved_modules:
        raise SaveError(f"the model has no adapter {name!r} to save")
    full = model.state_dict()
    embeddings = {f"{x.path}.base_layer.weight" for x in injected.layers.values()
                  if f"{x.path}.lora_embedding_A.{name}" in full}  # (saved with it, as peft does)
    state = {k: v.detach() for k, v in full.items() if injected.owns(k) or k in embeddings}
    meta = sorted(k for k, v in state.items() if v.is_meta)
    if meta:
        raise SaveError(f"{counted(len(meta), 'adapter tensor')} "
                        f"{agreeing(len(meta), 'is', 'are')} on meta: {', '.join(meta[:5])}")
    per_expert = layout == "per_expert"
    transforms = layout_transforms(base.transforms, injected, per_expert, modules_to_save)
    if per_expert:
        refuse_blocks_off_diagonal(injected, base, state)
    prefix = "" if injected.prefix else PEFT_PREFIX  # (peft's file names carry it)
    source = open_checkpoint({prefix + k: v for k, v in state.items()})
    reverse = derived_groups(transforms, source)
    choice = MappingChoice(None, f"adapter {name!r} in the {layout} layout", transforms)
    return make_write_plan(directory, source, build(reverse), reverse.notes, choice,
                           Inversion.MAPPING, order=(), metadata={"format": "pt"},
                           max_shard_size=2 ** 62, overwrite=overwrite, threads=threads,
                           single_name=WEIGHTS_FILE)


def refuse_blocks_off_diagonal(injected: InjectedAdapter, base: MappingChoice,
                               state: dict[str, torch.Tensor]) -> None:
    """Raise :class:`SaveError` naming the fused-pair ``lora_B`` tensors whose values off
    their diagonal blocks are not zero (peft's packing: ``(out, r·E)``, expert fastest)."""
    pairs = {f.parameter: len(f.linears) for f in fused_targets(base.transforms) if f.pair}
    bad = []
    for layer in injected.layers.values():
        n = pairs.get(layer.parameter or "")
        key = f"{layer.path}.lora_B.{injected.name}.weight"  # (a model name)
        if n is None or key not in state:
            continue
        b = state[key]
        blocks = b.reshape(b.shape[0], -1, layer.experts).permute(2, 0, 1)  # (E, out, r)
        rows, cols = blocks.shape[1], blocks.shape[2]
        if rows % n or cols % n or not off_diagonal_zero(blocks, (rows // n,) * n,
                                                         (cols // n,) * n):
            bad.append(key)
    if bad:
        raise SaveError(f"{counted(len(bad), 'fused LoRA tensor')} "
                        f"{agreeing(len(bad), 'has', 'have')} non-zero values off their "
                        f"diagonal blocks (trained after fusion?), so "
                        f"{agreeing(len(bad), 'it has', 'they have')} no per-expert "
                        f"form and would lose those values: {', '.join(bad[:5])}; save them "
                        "in the fused layout (layout='fused')")
