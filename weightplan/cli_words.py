"""Errors and problems in the command line's words.

weightplan's messages advise in the API's words (``overwrite=True``, ``max_memory``,
``device_map='auto'``); the command line sets the same things with flags. Each entry
below is a phrase exactly as a message says it, then the same phrase for the command line;
the tensor-parallel fixes are written both ways beside their problems
(:mod:`weightplan.planner.core.sharding.advice`).
"""

from __future__ import annotations

import re

PHRASES = (
    ("pass overwrite=True", "pass --overwrite"),
    ("pass mapping= (a registered name or transforms)",
     "pass --model-type NAME (weightplan mappings lists them)"),
    ("then pass local_files_only=True or set HF_HUB_OFFLINE=1", "then set HF_HUB_OFFLINE=1"),
    ("or pass token=", "or set HF_TOKEN"),
    ("dequantize=True and to='fp8' exclude each other: dequantize writes bf16, to='fp8'",
     "--dequantize and --to fp8 exclude each other: --dequantize writes bf16, --to fp8"),
    # a file changed between the plan and its execution (convert plans, then executes)
    ("reverse=True and dequantize=True exclude each other: dequantize=True keeps",
     "--reverse and --dequantize exclude each other: --dequantize keeps"),
    ("reverse=True and to='fp8' exclude each other: to='fp8' keeps",
     "--reverse and --to fp8 exclude each other: --to fp8 keeps"),
    ("Call explain() again", "Run the command again"),
    ("call explain() again", "run the command again"),
    ("reverse=True turns", "--reverse turns"),
    # sizes and counts the flags take (units.parse_bytes, load.parse_threads)
    ("can't parse max_shard_size ", "can't parse --max-shard-size "),
    ("can't parse budget ", "can't parse --budget "),
    ("threads must be", "--threads must be"),  # (convert on a checkpoint with nothing to)
    # device_map= & co. (explain --device-map): the placement's requests and its fixes
    ("places a model's modules: pass the model",
     "places a model's modules: give a checkpoint directory with its config.json (and no "
     "--model-type)"),
    ("pass offload_folder= (a directory)", "pass --offload-folder DIR"),
    ("offload_folder ", "--offload-folder "),
    ("device_map: ", "--device-map: "),
    # FP8 that can't be kept (a block cut by a shard, a weight without its scale)
    ("load it dequantized (a floating model)", "pass --dequantize"),
    ("load it into a floating model instead", "pass --dequantize instead"),
    ("give the model floating parameters to dequantize instead", "pass --dequantize instead"),
)
# the keyword's name where a message names it (``max_memory key 'x'``, ``raise
# max_memory``), and ``device_map='auto'`` / ``variant='fp16'`` as the flag and its value
KEYWORDS = ((re.compile(r"\bmax_memory\b"), "--max-memory"),
            (re.compile(r"\bdevice_map='(\w+)'"), r"--device-map \1"),
            (re.compile(r"\bvariant='([^'\s]*)'"), r"--variant \1"))


def cli_wording(message: str) -> str:
    """An error's or problem's advice in the command line's words (its flags)."""
    from weightplan.planner.core.sharding.advice import cli_wording as tp_wording

    for python, flags in PHRASES:
        message = message.replace(python, flags)
    for pattern, flag in KEYWORDS:
        message = pattern.sub(flag, message)
    return tp_wording(message)
