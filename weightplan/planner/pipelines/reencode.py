"""Re-encoding MXFP4 as block FP8, losslessly (``weightplan convert SRC DST --to fp8``).

Every MXFP4 value is an E2M1 code times a power of two (``LUT[c] · 2^(s − 127)``), so a
128×128 tile of them is exactly block FP8 (E4M3) under a power-of-two scale whenever the
tile's values span no more binades than E4M3 holds (``6 · 2^6 < 448``; the smallest
value must stay on E4M3's subnormal grid). The plan is a conversion's write plan: each
MXFP4 weight dequantized (to bf16, exact for every MXFP4 value) and quantized again
(``QUANTIZE`` nodes with ``exact``: the float32 ``weight_scale_inv`` of each tile is the
smallest power of two that keeps it in range, and every element is checked to come back
bit for bit; a tile that can't is a :class:`~weightplan.errors.QuantizationError` naming
the tensor and the tile). The FP8 weight keeps the logical key and layout (gpt-oss's
``[E, in, out]``), so dequantizing the copy gives what dequantizing the MXFP4 gives.
Other tensors are copied as they are; each weight streams through its own step within
the read window.
"""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import compress

from weightplan.errors import QuantizationError
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.inputs.fp8_pairs import Fp8Pairing
from weightplan.planner.inputs.quant_config import DEFAULT_BLOCK, QuantConfig
from weightplan.planner.tensors.ir.quant_build import QuantContext, packed_pairing

TARGETS = ("fp8",)


def reencode_context(source: object, ckpt: Checkpoint, to: str
                     ) -> tuple[QuantContext, dict[str, tuple[int, ...]]]:
    """The MXFP4 weights of ``ckpt`` to dequantize, and the FP8 block of each logical key.

    Raises:
        QuantizationError: ``to`` isn't ``"fp8"``, the checkpoint holds no MXFP4, or a
        weight's parts are missing or misshapen (naming the key).
    """
    if to not in TARGETS:
        raise QuantizationError(f"re-encoding to {to!r}: weightplan re-encodes MXFP4 as "
                                "'fp8' (128×128 block FP8 with float32 weight_scale_inv)")
    packed = packed_pairing(source, ckpt)
    wrong = [p.message for p in (packed.problems if packed is not None else ())]
    if wrong:
        raise QuantizationError("can't re-encode: " + "; ".join(wrong[:5]))
    keep = [w.scheme.format == "mxfp4" for w in (packed.stored if packed is not None else ())]
    if packed is None or not any(keep):
        raise QuantizationError(f"{source}: nothing to re-encode as FP8 (re-encoding takes "
                                "MXFP4: quantization_config.quant_method 'mxfp4')")
    mxfp4 = replace(packed, stored=list(compress(packed.stored, keep)),
                    at=list(compress(packed.at, keep)), routed={})
    quant = QuantContext(Fp8Pairing({}, (), frozenset()), None, None, packed=mxfp4)
    return quant, {k: DEFAULT_BLOCK for k in mxfp4.weights}


def reencoded_config(data: bytes) -> bytes:
    """config.json with a block FP8 ``quantization_config`` (float32 scales) in place of
    the MXFP4 one; the modules it didn't convert stay unconverted."""
    config = json.loads(data)
    if isinstance(config, dict):
        old = config.get("quantization_config") or {}
        skip = old.get("modules_to_not_convert") if isinstance(old, dict) else None
        config["quantization_config"] = QuantConfig(
            block=DEFAULT_BLOCK, modules_to_not_convert=tuple(skip or ())).to_dict()
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
