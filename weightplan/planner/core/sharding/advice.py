"""The fixes tensor-parallel problems advise, worded for Python and for the command line.

A plan problem says what to do in the words of the API (``experts='tp'``); the command
line has flags for the same things (``--ep``, ``--tp-plan``). Each fix is written once
here, both ways, so the CLI can reword a message without guessing at its phrasing.
"""

from __future__ import annotations

from typing import NamedTuple


class Fix(NamedTuple):
    python: str
    cli: str


NO_TP_PLAN = Fix("pass TensorParallel(plan={module glob: style})",
                 "pass --tp-plan '{\"MODULE GLOB\": \"STYLE\"}' (a JSON object, or @FILE.json)")
NO_EP_PLAN = Fix("use experts='tp', or pass plan= with grouped_gemm",
                 "drop --ep, or pass --tp-plan with grouped_gemm entries")
UNEVEN_EXPERTS = Fix("use experts='tp' or a world size dividing",
                     "drop --ep, or give --tp a number dividing")

FIXES = (NO_TP_PLAN, NO_EP_PLAN, UNEVEN_EXPERTS)


def cli_wording(message: str) -> str:
    """``message`` with each fix's Python advice put as the command line's."""
    for fix in FIXES:
        message = message.replace(fix.python, fix.cli)
    return message
