"""After the load: the ties the checkpoint stored both sides of, settled as transformers
settles them (see ``planner/pipelines/stored_ties.py``). Equal values: tied again as the
model declares (one tensor, two names; the copy is freed). Different values: left two
tensors, a warning naming both keys, and the model's tie bookkeeping
(``all_tied_weights_keys``) without the pair, so that it and a save see two tensors."""

from __future__ import annotations

import logging

import torch
from torch import nn

from weightplan.executor.init import module_and_attr
from weightplan.executor.model_sink import current_tensor
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.pipelines.stored_ties import FIX

log = logging.getLogger("weightplan")


def settle_stored_ties(model: nn.Module, info: ModelInfo) -> None:
    """Tie again or leave apart each pair of ``info.stored_ties`` (loaded by now)."""
    for kept, name in info.stored_ties:
        source, other = current_tensor(model, kept), current_tensor(model, name)
        equal = torch.equal(source.detach(), other.detach().to(source.device))
        if equal and source.device == other.device:
            module, attr = module_and_attr(model, name)
            if isinstance(source, nn.Parameter):
                module._parameters[attr] = source
            else:
                module._buffers[attr] = source
            continue
        if equal:  # (a device map put them apart: they stay so)
            log.info("%s and %s are equal, on %s and %s: left two tensors", kept, name,
                     source.device, other.device)
        else:
            from weightplan.terminal import terminal_text  # (keys come from the file)

            log.warning("%s", terminal_text(
                f"the model ties {name} to {kept}, but the checkpoint holds both with "
                f"different values: they are not tied (two tensors); {FIX} to say so"))
        _forget(model, kept, name)


def _forget(model: nn.Module, kept: str, name: str) -> None:
    """The pair out of transformers' ``all_tied_weights_keys`` (``{tied: source}``)."""
    tied = getattr(model, "all_tied_weights_keys", None)
    if not isinstance(tied, dict):
        return
    for target, source in list(tied.items()):
        if {target, source} == {kept, name}:
            del tied[target]
