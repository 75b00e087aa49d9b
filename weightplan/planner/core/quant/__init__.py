"""Fine-grained FP8: block math (:mod:`.blocks`, :mod:`.quantize`) and what dequantize /
quantize nodes carry (:mod:`.kinds`); packed formats (:mod:`.formats`). The checkpoint side
(``quantization_config``, weight ↔ scale pairing) is in
:mod:`weightplan.planner.inputs.quant_config` and :mod:`weightplan.planner.inputs.fp8_pairs`.

Import the submodule that holds what you need: this package imports none of them, so that
a plain load, which needs the dtype tables of :mod:`.blocks` at most, pays for nothing else.
"""
