"""Dequantizing offline: the quantized weights of a checkpoint on disk as floating tensors.

``weightplan convert SRC DST --dequantize`` writes a copy whose quantized weights (block
FP8 with its scales, or a packed format: MXFP4, compressed-tensors FP8/INT/NVFP4, ModelOpt
NVFP4) are dequantized into bf16 under their logical keys, their scales and other parts
gone; every other tensor is copied as it is. The plan is a write plan like any
conversion's: dequantize nodes per stored weight, streaming within its read window.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from weightplan.errors import QuantizationError
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.inputs.fp8_pairs import Fp8Pairing, Fp8ProblemKind, pair_scales
from weightplan.planner.inputs.packed_pairs import PackedPairing
from weightplan.planner.inputs.packed_routing import routed_entries
from weightplan.planner.inputs.quant_config import QuantConfig, read_quant_config
from weightplan.planner.tensors.ir.quant_build import (
    QuantContext, checkpoint_quant_config, packed_pairing)


def dequantize_context(source: object, ckpt: Checkpoint) -> QuantContext:
    """The pairs to dequantize every quantized weight of ``ckpt`` (no model: all of them).

    Raises:
        QuantizationError: nothing is quantized, or a weight can't be dequantized right
        (a missing or misshapen scale or part), naming the key.
    """
    config = None
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        config = read_quant_config(path if path.is_dir() else path.parent)
    pairing, packed = _pairs(source, ckpt, config)
    wrong = [p.message for p in pairing.problems  # (each names its file and key)
             if p.kind is not Fp8ProblemKind.STRAY_SCALE]
    wrong += [p.message for p in (packed.problems if packed is not None else ())]
    if wrong:
        raise QuantizationError("can't dequantize: " + "; ".join(wrong[:5])
                                + (f" (and {len(wrong) - 5} more)" if len(wrong) > 5 else ""))
    if not pairing.pairs and (packed is None or not packed.weights):
        raise QuantizationError(f"{source}: {NOTHING}")
    return QuantContext(pairing, None, config, packed=packed)


NOTHING = ("nothing to dequantize (no scaled FP8 weight and no packed-format config: "
           "quantization_config / hf_quant_config.json)")


def _pairs(source: object, ckpt: Checkpoint, config: QuantConfig | None
           ) -> tuple[Fp8Pairing, PackedPairing | None]:
    packed = packed_pairing(source, ckpt)
    routed = routed_entries(ckpt, packed)
    return pair_scales((ckpt if routed is None else routed).entries, config), packed


def nothing_quantized(source: object) -> str | None:
    """What ``explain --dequantize`` says of a checkpoint with nothing quantized (the
    words ``convert --dequantize`` refuses it with; explain plans it as it is, as
    ``from_pretrained(dequantize=True)`` loads it), ``None`` where something is."""
    from weightplan.planner.inputs.checkpoint import DirectoryRead, open_checkpoint

    ckpt = open_checkpoint(source)
    config = checkpoint_quant_config(source)
    pairing, packed = _pairs(source, ckpt, config)
    if pairing.pairs or (packed is not None and packed.weights):
        return None
    where = source.directory if isinstance(source, DirectoryRead) else source
    return f"{where}: {NOTHING}: planned as it is"


def dequantized_config(data: bytes) -> bytes:
    """config.json without its ``quantization_config`` (the copy is floating)."""
    config = json.loads(data)
    if isinstance(config, dict):
        config.pop("quantization_config", None)
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
