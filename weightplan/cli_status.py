"""The ``weightplan`` command's exit statuses: one per class of outcome, so that a script
tells "fix the command line" from "the checkpoint is bad", "run recover" and "a bug".

====  =====================================================================================
0     done; the plan has no problems
1     the plan has problems (missing or unexpected keys, shape mismatches, TP problems)
2     bad arguments: an unknown flag or value, a flag without the one it needs
      (argparse's status, and :class:`ArgumentError`)
3     the checkpoint can't be read: no such path (nor Hub repo), not a safetensors file, a
      corrupt or truncated header, a missing shard (:class:`CheckpointError`)
4     the directory holds a save interrupted in its commit: ``weightplan recover DIR``
      (:class:`InterruptedSaveError`)
5     any other weightplan error: the plan can't be made or run as asked (a mapping, the
      model's build, a budget, a save or convert that failed)
6     an unexpected error inside weightplan or a dependency (a bug: please report it)
7     another save or ``recover`` holds the directory's lock: run it again once that one is
      done (:class:`ConcurrentSaveError`, which names the holder)
120   stdout was closed early (``| head``)
130   interrupted (Ctrl-C)
143   terminated (SIGTERM)
====  =====================================================================================

Only the command line has statuses; each error class keeps its status (tested), so the
numbers are stable.
"""

from __future__ import annotations

from weightplan.errors import (ArgumentError, CheckpointError, ConcurrentSaveError,
                               InterruptedSaveError, UnexpectedError, WeightplanError)

OK, PROBLEMS, USAGE, CHECKPOINT, INTERRUPTED_SAVE, FAILED, BUG, BUSY = 0, 1, 2, 3, 4, 5, 6, 7
CLOSED, INTERRUPTED, TERMINATED = 120, 130, 143


def error_status(error: BaseException) -> int:
    """The exit status of a command that raised ``error`` (an ``Exception``; Ctrl-C, SIGTERM
    and a closed stdout have theirs)."""
    if isinstance(error, UnexpectedError) or not isinstance(error, WeightplanError):
        return BUG
    if isinstance(error, ArgumentError):
        return USAGE
    if isinstance(error, ConcurrentSaveError):
        return BUSY
    if isinstance(error, InterruptedSaveError):
        return INTERRUPTED_SAVE
    if isinstance(error, CheckpointError):
        return CHECKPOINT
    return FAILED
