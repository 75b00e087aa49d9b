"""``explain_save`` / ``explain_convert``: plan writing a checkpoint, from specs only.

Saving a model reads its load record backwards when it has one (exact: each loaded
conversion inverted node by node, :mod:`~weightplan.planner.write.invert`) and otherwise
routes the model's names through its mapping inverted per transform
(:func:`~weightplan.planner.write.reverse.derived_groups`). Converting on disk routes a
checkpoint's keys forward through a mapping, or backward through its inverse. Every path
gives groups that the one builder turns into conversions (once: ``quantize="fp8"``
quantizes the chosen outputs of those), and ends in the same :class:`WritePlanData`:
conversions, a shard layout, a schedule.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch

from weightplan.errors import ConflictingTransformError, MappingError, PlanError, SaveError
from weightplan.planner.core.problems import Note
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.checkpoint import Checkpoint, open_checkpoint
from weightplan.planner.inputs.model_info import ModelInfo, inspect_model
from weightplan.planner.inputs.paths import refuse_interrupted_save
from weightplan.planner.keys.lookup import Finder
from weightplan.planner.keys.patterns import natural_key
from weightplan.planner.keys.registry import MappingChoice
from weightplan.planner.keys.unrecorded import without_prefix_changes
from weightplan.planner.pipelines.load import choose_mapping, parse_threads
from weightplan.planner.pipelines.lower import lower
from weightplan.planner.pipelines.plan import Direction, PlanOptions
from weightplan.planner.pipelines.write_plan import Inversion, WritePlanData
from weightplan.planner.tensors.ir.build import Conversion, SinkKind, TargetStatus, build_conversions
from weightplan.planner.tensors.lower.placement import Step
from weightplan.planner.write.fp8_save import (
    blocks_to_quantize, check_quantize, quantization_config, quantize_outputs,
)
from weightplan.planner.write.offloaded import get_offloaded, model_source
from weightplan.planner.write.record import LoadRecord, get_record
from weightplan.planner.write.reverse import (
    ReverseGroups, derived_groups, forward_groups, record_groups,
)
from weightplan.planner.write.shards import INDEX_NAME, SINGLE_NAME, ShardLayout, plan_layout
from weightplan.units import parse_bytes


def explain_save_plan(model: torch.nn.Module, directory: str | os.PathLike[str], *,
                      mapping: object = None, max_shard_size: int | str = "5GB",
                      overwrite: bool = False, threads: int = 4, finder: Finder | None = None,
                      quantize: str | None = None) -> WritePlanData:
    """Plan writing ``model`` to ``directory`` in its checkpoint's original layout.

    The arguments are :func:`weightplan.explain_save`'s (documented there; ``quantize`` is
    :mod:`.fp8_save`'s work), ``mapping`` given by name already resolved; ``finder`` is the
    mapping lookup's second source (the transformers bridge).
    """
    check_quantize(quantize)
    record = get_record(model) if mapping is None else None
    info = inspect_model(model)  # (once: the state's names, tied aliases)
    source = model_state(model, info, aliases=record is not None, recorded=record is not None)
    if record is not None:
        names = {a: t.aliases for t in info.unique() for a in t.aliases}
        reverse = record_groups(record, source, names, unsaved(model))
        choice = MappingChoice(None, "the record of the model's last weightplan load", ())
        order, metadata, how = record.order, dict(record.metadata), Inversion.RECORD
    else:
        choice = choose_mapping(mapping, model, finder)
        if mapping is None:  # like transformers: no record, so no PrefixChange to invert
            choice = without_prefix_changes(choice)
        reverse = derived_groups(choice.transforms, source)
        order, metadata, how = (), {"format": "pt"}, Inversion.MAPPING
    conversions, notes = _fp8_save(quantize, build(reverse), record)
    return make_write_plan(directory, source, conversions, reverse.notes + notes, choice, how,
                           order=order, metadata=metadata, max_shard_size=max_shard_size,
                           overwrite=overwrite, threads=threads)


def build(reverse: ReverseGroups) -> tuple[Conversion, ...]:
    """The write direction's conversions: the one builder, with file sinks."""
    return build_conversions(reverse.groups, reverse.outputs, None, SinkKind.FILE, reverse.quant)


def _fp8_save(quantize: str | None, conversions: tuple[Conversion, ...],
              record: LoadRecord | None) -> tuple[tuple[Conversion, ...], tuple[str, ...]]:
    """``quantize="fp8"``: the chosen outputs quantized, and a note of the config."""
    if quantize != "fp8":
        return conversions, ()
    blocks = blocks_to_quantize(record, ((t.key, t.dest) for c in conversions for t in c.targets))
    config = quantization_config(blocks)
    notes = () if config is None else (
        f"written as block FP8; the config.json to go with it has quantization_config "
        f"= {json.dumps(config, sort_keys=True)}",)
    return quantize_outputs(conversions, blocks), notes


def explain_convert_plan(source: object, directory: str | os.PathLike[str], *, mapping: object,
                         reverse: bool = False, max_shard_size: int | str = "5GB",
                         overwrite: bool = False, threads: int = 4, dequantize: bool = False,
                         to: str | None = None, budget: int | str | None = None
                         ) -> WritePlanData:
    """Plan converting a checkpoint on disk to another layout, without a model: the
    arguments are :func:`weightplan.explain_convert`'s (documented there)."""
    if mapping is None:
        raise MappingError("converting needs a mapping: a registered name or transforms")
    ckpt = open_checkpoint(source)
    choice = choose_mapping(mapping, None)
    if dequantize or to is not None:
        return _dequantized_copy(source, ckpt, choice, directory, max_shard_size, overwrite,
                                 threads, to, budget)
    groups = derived_groups(choice.transforms, ckpt) if reverse else forward_groups(choice, ckpt)
    conversions = build(groups)
    if reverse and all(_as_is(c) for c in conversions):
        name = f"the mapping {choice.key!r}" if choice.key is not None else "the mapping"
        why = (f"{name} renames and converts nothing" if not choice.transforms else
               f"no key is in the layout {name} converts to (this is the original one)")
        raise PlanError(f"{ckpt.description}: nothing to reverse: {why}; {REVERSE_WHAT}")
    order = tuple(e.key for e in sorted(ckpt.entries.values(),
                                        key=lambda e: (e.file or "", e.offset)))
    how = Inversion.REVERSE if reverse else Inversion.FORWARD
    notes = groups.notes + _kept_packed_note(source, ckpt, conversions)
    return make_write_plan(directory, ckpt, conversions, notes, choice, how,
                           order=order, metadata=dict(ckpt.metadata) or {"format": "pt"},
                           max_shard_size=max_shard_size, overwrite=overwrite, threads=threads,
                           budget=budget)


# what ``reverse=True`` is for, said where there is nothing to reverse
REVERSE_WHAT = "reverse=True turns a checkpoint in the model's layout back into the original one"


def _as_is(conv: Conversion) -> bool:
    """One tensor written under its own name, unchanged."""
    entries = conv.group.entries
    return (not conv.ops and len(entries) == 1
            and tuple(t.key for t in conv.targets) == (entries[0].key,))


def _kept_packed_note(source: object, ckpt: Checkpoint, conversions: tuple[Conversion, ...]
                      ) -> tuple[str, ...]:
    """A packed-format checkpoint (MXFP4, compressed-tensors, ModelOpt) converted into the
    model's layout keeps its format, merged like the weights (``experts.gate_up_proj_packed``
    …): what a model holding that format loads, not a floating model (transformers' builds
    none on a CPU), so the plan says so."""
    from weightplan.planner.inputs.dtype import quantized_input

    if all(_as_is(c) for c in conversions) or not quantized_input(source, ckpt, None):
        return ()
    from weightplan.planner.tensors.ir.quant_build import packed_pairing

    packed = packed_pairing(source, ckpt)
    if packed is None or not packed.weights:
        return ()
    return ("the quantized weights keep their packed format in the model's layout: a model "
            "holding that format loads this copy, a floating one (from_pretrained's) doesn't "
            "(those weights would be missing); for that, convert with --dequantize "
            "(dequantize=True), or load the source",)


def _dequantized_copy(source: object, ckpt: Checkpoint, choice: MappingChoice,
                      directory: str | os.PathLike[str], max_shard_size: int | str,
                      overwrite: bool, threads: int, to: str | None = None,
                      budget: int | str | None = None) -> WritePlanData:
    """The conversion with every quantized weight dequantized (see :mod:`.dequantize`),
    or with ``to="fp8"`` each MXFP4 weight re-encoded as block FP8 (:mod:`.reencode`)."""
    from weightplan.planner.pipelines.dequantize import dequantize_context
    from weightplan.planner.pipelines.reencode import reencode_context
    from weightplan.planner.tensors.ir.quant_build import routed_checkpoint

    quant, blocks = (dequantize_context(source, ckpt), None) if to is None \
        else reencode_context(source, ckpt, to)
    groups = forward_groups(choice, routed_checkpoint(ckpt, quant))
    conversions = build_conversions(groups.groups, groups.outputs, None, SinkKind.FILE, quant)
    if blocks is not None:
        conversions = quantize_outputs(conversions, blocks, exact=True)
    order = tuple(e.key for e in sorted(ckpt.entries.values(),
                                        key=lambda e: (e.file or "", e.offset)))
    return make_write_plan(directory, ckpt, conversions, groups.notes, choice, Inversion.FORWARD,
                           order=order, metadata=dict(ckpt.metadata) or {"format": "pt"},
                           max_shard_size=max_shard_size, overwrite=overwrite, threads=threads,
                           budget=budget)


def model_state(model: torch.nn.Module, info: ModelInfo, *, aliases: bool,
                recorded: bool = False) -> Checkpoint:
    """The model's parameters and persistent buffers, detached (tied names once, unless
    ``aliases``), as a checkpoint: the ones offloaded to the disk read from their files
    (:mod:`~weightplan.planner.write.offloaded`; ``recorded``: the save writes the dtypes
    the load record says); other meta tensors can't be saved. The names the model declares
    unsaved (transformers' ``_keys_to_ignore_on_save``, exact names) are left out, as
    ``save_pretrained`` leaves them."""
    state = model.state_dict()
    keep = set(state) if aliases else {t.name for t in info.unique()}
    keep -= unsaved(model)
    return model_source({k: v for k, v in state.items() if k in keep}, info,
                        get_offloaded(model), recorded)


def unsaved(model: torch.nn.Module) -> frozenset[str]:
    """The names ``model`` declares not to save (transformers' ``_keys_to_ignore_on_save``)."""
    return frozenset(getattr(model, "_keys_to_ignore_on_save", None) or ())


def make_write_plan(directory: str | os.PathLike, source: Checkpoint,
                    conversions: tuple[Conversion, ...], notes: tuple[str, ...],
                    choice: MappingChoice, how: Inversion, *, order: tuple[str, ...],
                    metadata: dict[str, str], max_shard_size: int | str, overwrite: bool,
                    threads: int, single_name: str = SINGLE_NAME,
                    budget: int | str | None = None) -> WritePlanData:
    """Check the outputs, lay them out in shards (one: named ``single_name``), lower and
    schedule them (under ``budget``, the bytes the write may hold at most: reads in
    flight, staged outputs, temporaries; :class:`BudgetError` with the minimum when
    nothing fits)."""
    _check_outputs(conversions)
    layout = plan_layout(_ordered_specs(conversions, order),
                         parse_bytes(max_shard_size, what="max_shard_size"), metadata,
                         single_name=single_name)
    check_directory(Path(directory), layout, overwrite)
    limit = None if budget is None else parse_bytes(budget, what="budget")
    options = PlanOptions(None, parse_threads(threads), limit)

    def by_location(steps: Iterable[Step]) -> tuple[Step, ...]:
        return tuple(sorted(steps, key=lambda p: _first_location(p, layout)))

    graph, schedule = lower(conversions, source, order=by_location, threads=options.threads,
                            budget=limit)
    direction = Direction.CONVERT if how in (Inversion.FORWARD, Inversion.REVERSE) \
        else Direction.SAVE
    return WritePlanData(direction, source, choice, choice.transforms, conversions, graph,
                         schedule, options, how, str(directory), layout, overwrite,
                         source.left_out_notes() + tuple(Note(str(directory), n) for n in notes))


def _check_outputs(conversions: tuple[Conversion, ...]) -> None:
    seen: dict[str, Conversion] = {}
    for conv in conversions:
        for t in conv.targets:
            if t.status is TargetStatus.MISMATCH and t.expected is not None:
                raise SaveError(f"{t.key}: the model's tensors give {list(t.produced.shape)} "
                                f"but the recorded checkpoint had {list(t.expected.shape)}")
            other = seen.setdefault(t.key, conv)
            if other is not conv:
                raise ConflictingTransformError(f"two model tensors would be written as {t.key}: "
                                                f"from {other.label} and {conv.label}")


def _ordered_specs(conversions: tuple[Conversion, ...], order: tuple[str, ...]
                   ) -> list[tuple[str, TensorSpec]]:
    specs = {t.key: t.dest for c in conversions for t in c.targets}
    rank = {k: i for i, k in enumerate(order)}
    keys = sorted(specs, key=lambda k: (rank.get(k, len(rank)), natural_key(k)))
    return [(k, specs[k]) for k in keys]


def _first_location(program: Step, layout: ShardLayout) -> tuple[int, int]:
    names = {f.name: i for i, f in enumerate(layout.files)}
    firsts = [layout.locations[d.key] for d in program.destinations]
    return min((names[f], off) for f, off in firsts)


def check_directory(directory: Path, layout: ShardLayout, overwrite: bool) -> None:
    """Refuse, before writing anything, a target that can't or shouldn't take the files
    (the writer checks again under the directory's lock)."""
    if directory.exists() and not directory.is_dir():
        raise SaveError(f"{directory} exists and is not a directory")
    if directory.is_dir():
        refuse_interrupted_save(directory, then="save")
    existing = sorted(p.name for p in directory.glob("*.safetensors")) if directory.is_dir() else []
    if directory.is_dir() and (directory / INDEX_NAME).exists():
        existing.append(INDEX_NAME)
    if existing and not overwrite:
        raise SaveError(f"{directory} already holds a checkpoint ({', '.join(existing[:4])}); "
                        "pass overwrite=True to replace it")
    anchor = directory
    while not anchor.exists():
        anchor = anchor.parent
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise SaveError(f"{anchor} is not writable")
    needed = sum(f.size for f in layout.files)
    free = shutil.disk_usage(anchor).free
    if needed > free:
        raise SaveError(f"{directory}: the checkpoint needs {needed} bytes but only {free} are "
                        "free on that filesystem")
