"""``explain_adapter_save``: an adapter loaded by weightplan, written back in the layout its
file had (per-expert linears again, peft's saved names), bit for bit.

The load record is read backwards, restricted to the adapter's conversions. A fused
``lora_B`` whose blocks off the diagonal are not zero (trained after fusion) has no
per-expert form: the plan refuses it, naming the tensor, rather than drop those values.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from weightplan.errors import SaveError
from weightplan.planner.core.ops import BlockDiagonal
from weightplan.planner.core.ops.blocks import off_diagonal_zero
from weightplan.planner.inputs.adapter import WEIGHTS_FILE
from weightplan.planner.inputs.adapter_model import (
    PEFT_PREFIX, InjectedAdapter, adapter_tensor, inspect_adapter,
)
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.inputs.model_info import inspect_model
from weightplan.planner.keys.registry import MappingChoice
from weightplan.planner.pipelines.adapter_summary import CONFIGS_ATTRIBUTE
from weightplan.planner.pipelines.save import build, make_write_plan
from weightplan.planner.pipelines.write_plan import Inversion, WritePlanData
from weightplan.planner.write.record import LoadRecord, RecordedConversion, get_record
from weightplan.planner.write.offloaded import get_offloaded, model_source
from weightplan.units import agreeing, counted
from weightplan.planner.write.reverse import record_groups


def adapter_config_bytes(model: torch.nn.Module, name: str) -> bytes:
    """The ``adapter_config.json`` the adapter was loaded with (kept by the executor)."""
    text = getattr(model, CONFIGS_ATTRIBUTE, {}).get(name)
    if text is None:
        raise SaveError(f"adapter {name!r} was not loaded by weightplan: no config to write")
    return text.encode()


def explain_adapter_save(model: torch.nn.Module, directory: str | os.PathLike[str], *,
                         name: str = "default", overwrite: bool = False, threads: int = 4
                         ) -> WritePlanData:
    """Plan writing adapter ``name`` of ``model`` to ``directory`` as its file was.

    Raises:
        SaveError: the adapter wasn't loaded by weightplan, is on meta (not offloaded), or a
            fused tensor has no per-expert form (naming it).
    """
    injected = inspect_adapter(model, name)
    record = _adapter_record(model, injected)
    state = {k: v.detach() for k, v in model.state_dict().items()
             if any(k == t for c in record.conversions for t, _ in c.targets)}
    # (a module on the disk: its tensors read from their files, as a model's save reads them)
    source = model_source(state, inspect_model(model), get_offloaded(model), recorded=True)
    refuse_off_diagonal(record.conversions, lambda k: _value(state[k], source, k))
    reverse = record_groups(record, source)
    choice = MappingChoice(None, f"the record of adapter {name!r}'s weightplan load", ())
    return make_write_plan(directory, source, build(reverse), reverse.notes, choice,
                           Inversion.RECORD, order=record.order, metadata=dict(record.metadata),
                           max_shard_size=2 ** 62, overwrite=overwrite, threads=threads,
                           single_name=WEIGHTS_FILE)


def _adapter_record(model: torch.nn.Module, injected: InjectedAdapter) -> LoadRecord:
    """The load record's conversions of the adapter: its own tensors, and base-layer ones
    its file held (an embedding peft saved with it: all keys with peft's prefix)."""
    record = get_record(model)
    conversions = record.conversions if record is not None else ()
    mine = tuple(c for c in conversions if c.targets and (
        all(injected.owns(k) for k, _ in c.targets)
        or (all(k.startswith(PEFT_PREFIX) for k in c.keys)
            and not any(adapter_tensor(k) for k, _ in c.targets))))  # (not another's)
    if record is None or not any(all(injected.owns(k) for k, _ in c.targets) for c in mine):
        raise SaveError(f"the model's adapter {injected.name!r} was not loaded by weightplan, "
                        "so its file's layout is unknown; load it with weightplan.explain("
                        "model, ADAPTER_DIR).execute() or from_pretrained(base, adapter=...)")
    keys = {k for c in mine for k in c.keys}
    return LoadRecord(mine, (), record.metadata, tuple(k for k in record.order if k in keys))


def _value(tensor: torch.Tensor, source: Checkpoint, key: str) -> torch.Tensor:
    """``tensor``, or where it is offloaded (on meta) its bytes read from its file."""
    if not tensor.is_meta:
        return tensor
    entry = source.entries[key]
    assert entry.file is not None  # (a meta tensor's entry is its file's: model_source)
    with open(entry.file, "rb") as f:
        f.seek(entry.offset)
        raw = bytearray(f.read(entry.spec.nbytes))
    return torch.frombuffer(raw, dtype=entry.spec.dtype).reshape(entry.spec.shape)


def refuse_off_diagonal(conversions: tuple[RecordedConversion, ...],
                        value: Callable[[str], torch.Tensor]) -> None:
    """Fused ``lora_B`` tensors (``value``: a model tensor's values by name) whose
    off-diagonal blocks are not zero: refused by name."""
    bad = []
    for c in conversions:
        at = next((i for i, op in enumerate(c.ops) if isinstance(op, BlockDiagonal)), None)
        if at is None or len(c.targets) != 1:
            continue
        streams: tuple[tuple[torch.Tensor, ...], ...] = ((value(c.targets[0][0]),),)
        for op in (op.inverse() for op in reversed(c.ops[at + 1:])):
            streams = op.forward(streams)
        block = c.ops[at]
        assert isinstance(block, BlockDiagonal) and block.rows and block.cols
        if not off_diagonal_zero(streams[0][0], block.rows, block.cols):
            bad.append(c.targets[0][0])
    if bad:
        raise SaveError(f"{counted(len(bad), 'fused LoRA tensor')} "
                        f"{agreeing(len(bad), 'has', 'have')} non-zero values off their "
                        f"diagonal blocks (trained after fusion?), so "
                        f"{agreeing(len(bad), 'it has', 'they have')} no per-expert "
                        f"form and would lose those values: {', '.join(bad[:5])}; save the "
                        "adapter with peft in its fused layout instead")
