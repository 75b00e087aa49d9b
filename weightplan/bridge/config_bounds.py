"""A ``config.json`` can't ask for unbounded work: layer and expert counts are bounded.

Building a model on meta costs time and memory per module: ``num_hidden_layers: 1e9``
would build layers forever. Before transformers sees the config, every layer count and
expert count in it (nested configs included: ``text_config``, ...) is compared with
:data:`weightplan.limits.MAX_LAYERS` / :data:`~weightplan.limits.MAX_EXPERTS`; a larger
one is a :class:`ModelBuildError` naming the file, the field and how to raise the limit.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from weightplan.errors import ModelBuildError
from weightplan.limits import MAX_EXPERTS, MAX_LAYERS, Limit

LAYER_FIELDS = frozenset((
    "num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_decoder_layers",
    "num_encoder_layers", "encoder_layers", "decoder_layers", "num_nextn_predict_layers",
))
EXPERT_FIELDS = frozenset((
    "num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
    "n_shared_experts", "num_shared_experts",
))


def check_config_bounds(config: dict, path: Path) -> None:
    """:class:`ModelBuildError` if a layer or expert count of ``config`` is over its limit."""
    for where, value in _counts(config, ""):
        field = where.rpartition(".")[2]
        limit = MAX_LAYERS if field in LAYER_FIELDS else MAX_EXPERTS
        if _over(value, limit):
            raise ModelBuildError(f"{path}: {where} is {value}; building that many {limit.unit} "
                                  f"would not end in reasonable time or memory: {limit.hint()}")


def _counts(value: object, where: str) -> Iterator[tuple[str, object]]:
    """Every (dotted field, value) of a count field, in nested objects too."""
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{where}.{key}" if where else str(key)
            if key in LAYER_FIELDS or key in EXPERT_FIELDS:
                yield name, item
            elif isinstance(item, (dict, list)):
                yield from _counts(item, name)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _counts(item, f"{where}[{i}]")


def _over(value: object, limit: Limit) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        limit.exceeded_by(value)
