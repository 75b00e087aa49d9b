"""``save(..., quantize="fp8")``: which written tensors are quantized, and how.

A model that was dequantized from an FP8 checkpoint is saved at its own dtype without
scales by default (exact for what it holds). With ``quantize="fp8"`` the tensors that
were FP8 in the loaded checkpoint (the load record says which, and their blocks) are
quantized again into ``*.weight`` + ``*.weight_scale_inv``; a model with no record gets
its linear-layer weights quantized (2-D or per-expert 3-D floating ``.weight`` /
``_proj`` tensors, not embeddings, ``lm_head``, norms or routers), in 128×128 blocks. A
model that kept FP8 writes its FP8 tensors and scales back as they are either way.
"""

from __future__ import annotations

from collections.abc import Iterable

from weightplan.errors import SaveError
from weightplan.planner.inputs.fp8_model import Fp8Model, Fp8Param
from weightplan.planner.inputs.fp8_pairs import Fp8Pairing, scale_key
from weightplan.planner.inputs.quant_config import DEFAULT_BLOCK, QuantConfig
from weightplan.planner.core.quant.blocks import FP8_DTYPES
from weightplan.planner.tensors.ir.quant_build import QuantContext
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.write.record import LoadRecord

QUANTIZE_CHOICES = (None, "fp8")
SKIPPED = ("embed", "lm_head", "norm", ".gate.", "router")


def check_quantize(quantize: object) -> None:
    if quantize not in QUANTIZE_CHOICES:
        raise SaveError(f"quantize={quantize!r}: use None (write what the model holds) or "
                        "'fp8' (block FP8 with weight_scale_inv, DeepSeek-V3 layout)")


def quantizable(key: str, spec: TensorSpec) -> bool:
    """The default for models without a record: linear weights (see the module docstring)."""
    floating = spec.dtype.is_floating_point and spec.dtype not in FP8_DTYPES
    named = key.endswith(".weight") or key.endswith("_proj")
    return floating and named and len(spec.shape) in (2, 3) and not any(s in key for s in SKIPPED)


def save_quant_context(blocks: dict[str, tuple[int, ...]]) -> QuantContext | None:
    """A context whose 'FP8 parameters' are the output keys to quantize, with their blocks."""
    if not blocks:
        return None
    params = {k: Fp8Param(k, scale_key(k), tuple(b)) for k, b in blocks.items()}
    pairing = Fp8Pairing({}, (), frozenset())
    return QuantContext(pairing, Fp8Model(params, (), DEFAULT_BLOCK), QuantConfig())


def blocks_to_quantize(record: LoadRecord | None, outputs: Iterable[tuple[str, TensorSpec]]
                       ) -> dict[str, tuple[int, ...]]:
    """Output key → block: the record's dequantized keys, else the default rule."""
    if record is not None:
        recorded = {k: b for c in record.conversions for k, b in c.dequantized}
        if recorded:
            return recorded
    return {k: DEFAULT_BLOCK for k, spec in outputs if quantizable(k, spec)}


def quantization_config(context: QuantContext | None) -> dict | None:
    """The ``quantization_config`` that describes what was written (``None``: not FP8)."""
    if context is None or context.model is None:
        return None
    blocks = {p.block for p in context.model.params.values()}
    block = next(iter(blocks)) if len(blocks) == 1 else DEFAULT_BLOCK
    return QuantConfig(block=block).to_dict()
