"""After the load: peft's trainable tokens' ``trainable_tokens_original`` (the base's rows
at the trained indices; a non-persistent buffer peft copies from the base weight when it
injects, which the injection on meta left on meta) copied from the loaded base weight,
as the plan's adapter section lists them (see ``planner/pipelines/adapter_summary``)."""

from __future__ import annotations

import torch
from torch import nn

from weightplan.errors import ExecutionError
from weightplan.executor.model_sink import current_tensor
from weightplan.planner.pipelines.adapter_summary import TrainableTokens


def fill_token_rows(model: nn.Module, tokens: tuple[TrainableTokens, ...]) -> None:
    """Each layer's original rows from its base weight (a tied layer shares the buffer).

    Raises:
        ExecutionError: the base weight is not in memory (placed on the disk).
    """
    for t in tokens:
        weight = current_tensor(model, t.base)
        if weight.is_meta:
            raise ExecutionError(f"{t.base} is not in memory (placed on the disk): "
                                 f"trainable tokens' {t.original} can't be filled from it")
        rows = torch.tensor(t.rows, dtype=torch.long, device=weight.device)
        originals = model.get_submodule(t.layer).get_submodule("trainable_tokens_original")
        originals.register_buffer(t.name, weight.detach()[rows].clone(), persistent=False)
