"""After the load: the ties the checkpoint stored both sides of, settled as transformers
settles them (see ``planner/pipelines/stored_ties.py``). Equal values: tied again as the
model declares (one tensor, two names; the copy is freed). Different values: left two
tensors, a warning naming both keys, and the model's tie bookkeeping
(``all_tied_weights_keys``) without the pair, so that it and a save see two tensors.

Under tensor parallel each rank compares its own shards of the two (sharded alike), and
the ranks agree (one ``all_reduce`` of every pair's answer, on the load's mesh), so all
tie or none; before it they agree they got that far (a rank that failed is a
``RankFailedError`` on the others, not a wait in the ``all_reduce``). A name on the disk
(left on meta) is compared from its offloaded file, in the model's dtype; two different
ones both on the disk are an error (on meta, the model's next inspection, a save's,
would make them one again)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from weightplan.errors import ExecutionError, RankFailedError
from weightplan.executor.init import module_and_attr
from weightplan.executor.model_sink import current_tensor
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.pipelines.stored_ties import FIX
from weightplan.terminal import terminal_text  # (keys come from the file)

if TYPE_CHECKING:
    from weightplan.planner.pipelines.agreement import Agreement
    from weightplan.planner.tensors.ir.shard_nodes import Sharding

log = logging.getLogger("weightplan")


def settle_stored_ties(model: nn.Module, info: ModelInfo, *, sharding: Sharding | None = None,
                       disk: Mapping[str, tuple[str, str]] | None = None,
                       agreement: Agreement | None = None) -> None:
    """Tie again or leave apart each pair of ``info.stored_ties`` (loaded by now);
    ``disk``: offloaded names → (safetensors file, key in it); ``agreement``: where the
    ranks tell each other they got this far, before they compare."""
    pairs = info.stored_ties
    tensors = [(current_tensor(model, kept), current_tensor(model, name)) for kept, name in pairs]
    mine = [_equal(k, n, a, b, disk or {}) for (k, n), (a, b) in zip(pairs, tensors, strict=True)]
    if agreement is not None:
        agreement.agree()
    equal = _agreed(mine, sharding)
    for (kept, name), (source, other), same in zip(pairs, tensors, equal, strict=True):
        if same and source.device == other.device:  # (both resident there, or both on meta)
            module, attr = module_and_attr(model, name)
            if isinstance(source, nn.Parameter):
                module._parameters[attr] = source
            else:
                module._buffers[attr] = source
            continue
        if not same and source.is_meta and other.is_meta:
            raise ExecutionError(terminal_text(
                f"the model ties {name} to {kept}, but the checkpoint holds both with "
                "different values, and both are on the disk, where they can't stay two "
                "tensors (inspected on meta again, as a save does, they are one): give "
                f"{name}'s module a device in the device map, or {FIX}"))
        if same:  # (a device map put them apart: they stay so)
            log.info("%s and %s are equal, on %s and %s: left two tensors", kept, name,
                     source.device, other.device)
        else:
            log.warning("%s", terminal_text(
                f"the model ties {name} to {kept}, but the checkpoint holds both with "
                f"different values: they are not tied (two tensors); {FIX} to say so"))
        _forget(model, kept, name)


def _equal(kept: str, name: str, source: torch.Tensor, other: torch.Tensor,
           disk: Mapping[str, tuple[str, str]]) -> bool:
    """This rank's answer: its values (its shards under tensor parallel) of the two."""
    a, b = _values(kept, source, disk), _values(name, other, disk)
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b.to(a.device))


def _values(name: str, tensor: torch.Tensor, disk: Mapping[str, tuple[str, str]]
            ) -> torch.Tensor:
    tensor = tensor.detach()
    if hasattr(tensor, "to_local"):  # a DTensor: this rank's shard
        tensor = tensor.to_local()
    if tensor.is_meta and name in disk:  # offloaded: read back from its file
        from safetensors import safe_open

        path, key = disk[name]
        with safe_open(path, framework="pt") as f:  # (a file referenced in place holds the
            return f.get_tensor(key).to(tensor.dtype)  # checkpoint's dtype: cast as loaded)
    return tensor


def _agreed(mine: list[bool], sharding: Sharding | None) -> list[bool]:
    """Every pair equal on every rank of the load's mesh (alone: this rank's answers)."""
    mesh = None if sharding is None else sharding.mesh
    if mesh is None or not mine:
        return mine
    import torch.distributed as dist

    flags = torch.tensor(mine, dtype=torch.int32, device=mesh.device_type)
    try:
        dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=mesh.get_group())
    except RuntimeError as e:
        raise RankFailedError(f"the ranks could not agree whether the ties stored apart "
                              f"hold equal values (a rank left the process group?): "
                              f"{type(e).__name__}: {e}") from e
    return [bool(f) for f in flags.tolist()]


def _forget(model: nn.Module, kept: str, name: str) -> None:
    """The pair out of transformers' ``all_tied_weights_keys`` (``{tied: source}``)."""
    tied = getattr(model, "all_tied_weights_keys", None)
    if not isinstance(tied, dict):
        return
    for target, source in list(tied.items()):
        if {target, source} == {kept, name}:
            del tied[target]
