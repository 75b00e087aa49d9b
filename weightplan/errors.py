"""weightplan's exceptions.

Every error weightplan raises is a :class:`WeightplanError`; no dependency's exception
escapes (they are wrapped and chained with ``from``). The tree::

    WeightplanError
    ├── CheckpointError              a checkpoint file can't be used (names the file)
    │   ├── UnsafeFormatError        pickle-based file (.bin/.pt); never unpickled
    │   ├── NotSafetensorsError      not a safetensors file at all
    │   ├── HeaderError              malformed or inconsistent header / index (names the key)
    │   ├── TruncatedCheckpointError file shorter than its header says
    │   ├── MissingShardError        the index names a shard that isn't there
    │   ├── UnsafePathError          an index names a path outside the checkpoint directory,
    │   │                            or a special file (FIFO, device, directory)
    │   ├── InterruptedSaveError     the directory holds a save interrupted during its commit
    │   │                            (``weightplan recover DIR`` completes it)
    │   └── StaleCheckpointError     the file changed between explain() and execute()
    ├── MappingError                 a mapping (transforms, ops) is misconfigured
    │   ├── PatternError             a source/target pattern can't be compiled or used
    │   ├── ConflictingTransformError two converters claim one pattern, a renaming targets
    │   │                            a converter's output, two mappings claim one submodule
    │   ├── IndexGapError            an index wildcard collected 0,1,2,4 (3 is missing)
    │   ├── OpError                  an op can't apply to its inputs (Chunk that can't split, ...)
    │   ├── NotInvertibleError       a transform or op has no exact inverse
    │   └── RegistryError            registering or looking up a mapping failed
    ├── PlanError                    the plan can't be executed as asked
    │   ├── ShapeMismatchError       converted shape != model parameter shape
    │   ├── StrictLoadError          missing / unexpected keys with ``strict=True``
    │   ├── MetaBufferError          buffers left on meta that nothing can rebuild
    │   ├── BudgetError              no schedule fits the memory budget (or the tensors a
    │   │                            load would allocate don't fit this machine's memory)
    │   ├── ParallelError            a tensor-parallel configuration can't work (names the fix)
    │   ├── LossyCastError           a checkpoint tensor would be cast to a dtype of another
    │   │                            kind that loses values (complex → real, float → integer,
    │   │                            integer → bool); names the file and key
    │   ├── GraphError               the plan graph or its lowering breaks an invariant
    │   │                            (``verify``; ``.problems`` lists every message)
    │   └── QuantizationError        a quantized checkpoint or model can't be loaded as asked
    │                                (quantization_config unusable, FP8 weight without its
    │                                scale, a scale grid that doesn't fit the weight)
    ├── ExecutionError               failure while loading; names the node (key, file, op)
    │   ├── PartialLoadError         a failed load into allocated tensors overwrote some of
    │   │                            them (``.overwritten`` lists exactly which)
    │   ├── OpenFileLimitError       the checkpoint has more files than this process may
    │   │                            open at once (``ulimit -n``; says how to raise it)
    │   └── RankFailedError          another rank of a cooperative load failed to plan or
    │                                read before the broadcasts (``.failures``: rank → error),
    │                                or of a sharded save (``.committed``: after its writer
    │                                committed), or left the process group during them
    ├── RenderError                  a plan can't be drawn as asked (detail, only=, format, dot)
    ├── SaveError                    failure while saving; nothing half-written is left (a
    │   │                            failure inside the commit leaves the directory marked
    │   │                            as an interrupted save, which ``weightplan recover``
    │   │                            completes)
    │   └── ConcurrentSaveError      another save or ``recover`` holds the directory's lock
    │                                (names the holder: process, host, since when)
    ├── ModelBuildError              no model could be built from a checkpoint's config.json
    │                                (transformers missing, or says what it could not build,
    │                                or the config asks to run code shipped with it)
    ├── ArgumentError                a public function was called with an argument of the
    │                                wrong type or value (also a ``TypeError``)
    └── UnexpectedError              anything else that went wrong inside weightplan or a
                                     dependency, wrapped (a bug: please report it)

Subclasses also derive from the matching builtin (``ValueError``, ``KeyError``,
``OSError``) so existing ``except`` clauses keep working.
"""

from __future__ import annotations


class WeightplanError(Exception):
    """Base class of every error weightplan raises."""


class CheckpointError(WeightplanError, OSError):
    """A checkpoint file can't be read or used."""

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None):
        where = ""
        if file is not None:
            where = f"{file}"
            if key is not None:
                where += f" [{key}]"
            where += ": "
        super().__init__(where + message)
        self.file = file
        self.key = key

    def __str__(self) -> str:  # OSError's __str__ would show errno formatting
        return str(self.args[0])


class UnsafeFormatError(CheckpointError):
    """A pickle-based checkpoint; weightplan never unpickles untrusted data."""


class NotSafetensorsError(CheckpointError):
    """The file is not a safetensors file."""


class HeaderError(CheckpointError):
    """A safetensors header or index is malformed or inconsistent."""


class TruncatedCheckpointError(CheckpointError):
    """The file is shorter than its header says."""


class MissingShardError(CheckpointError):
    """The index names a shard file that does not exist."""


class UnsafePathError(CheckpointError):
    """A path escapes the checkpoint directory, or names a FIFO, device or directory."""


class InterruptedSaveError(CheckpointError):
    """The directory holds a save that was interrupted during its commit."""


class StaleCheckpointError(CheckpointError):
    """A checkpoint file changed between planning and execution."""


class MappingError(WeightplanError, ValueError):
    """A mapping (transforms and ops) is misconfigured."""


class PatternError(MappingError):
    """A source or target pattern can't be compiled or used."""


class ConflictingTransformError(MappingError):
    """Two transforms (or mappings) claim the same keys."""


class IndexGapError(MappingError):
    """An index wildcard collected a non-contiguous set of indices."""


class OpError(MappingError):
    """A conversion op can't apply to the tensors it was given."""


class NotInvertibleError(MappingError):
    """A transform or op has no exact inverse."""


class RegistryError(MappingError, KeyError):
    """Registering or looking up a mapping failed."""

    def __str__(self) -> str:  # KeyError's __str__ would quote the message
        return str(self.args[0])


class PlanError(WeightplanError, ValueError):
    """The plan can't be executed as asked."""


class ShapeMismatchError(PlanError):
    """A converted tensor's shape differs from its model parameter."""


class StrictLoadError(PlanError):
    """Missing or unexpected keys while loading with ``strict=True``."""


class AdapterError(PlanError):
    """An adapter (peft's ``adapter_config.json`` + ``adapter_model.safetensors``) that
    can't load as asked: a type weightplan doesn't load, a malformed config, none of its
    tensors landing in the model (names the file, the key and the reason)."""


class MetaBufferError(PlanError):
    """Non-persistent buffers are on ``meta``, no checkpoint holds them and the model's own
    init can't rebuild them (names the buffers)."""


class BudgetError(PlanError):
    """No schedule stays under the memory budget."""

    def __init__(self, message: str, *, minimum_bytes: int | None = None):
        super().__init__(message)
        self.minimum_bytes = minimum_bytes


class ParallelError(PlanError):
    """A tensor/expert-parallel configuration can't work (mesh, ranks, plan, output)."""


class LossyCastError(PlanError):
    """Loading would cast a tensor to a dtype of another kind, losing values (the imaginary
    part, the fraction, every integer but 0 and 1), unless the mapping converts it."""


class GraphError(PlanError):
    """``verify`` found broken invariants; each message names the node and the fix."""

    def __init__(self, problems: "tuple[str, ...] | list[str]"):
        self.problems = tuple(problems)
        shown = "\n  ".join(self.problems[:10])
        more = f"\n  ... and {len(self.problems) - 10} more" if len(self.problems) > 10 else ""
        super().__init__(f"the plan graph is inconsistent ({len(self.problems)} problem(s)); "
                         f"this is a bug in weightplan or in a user op:\n  {shown}{more}")


class QuantizationError(PlanError):
    """A quantized (FP8) checkpoint, config or model can't be loaded or saved as asked."""

    def __init__(self, message: str, *, key: str | None = None, file: str | None = None):
        where = f"{file}: " if file else ""
        where += f"[{key}] " if key else ""
        super().__init__(where + message)
        self.key = key
        self.file = file


class ExecutionError(WeightplanError, RuntimeError):
    """A failure while executing a plan, wrapped with the node it happened at."""


class PartialLoadError(ExecutionError):
    """A failed load overwrote some already-allocated model tensors before failing."""

    def __init__(self, message: str, *, overwritten: tuple[str, ...] = ()):
        super().__init__(message)
        self.overwritten = overwritten


class OpenFileLimitError(ExecutionError):
    """The checkpoint has more files than this process may open at once."""


class RankFailedError(ExecutionError):
    """Other ranks of a cooperative load failed before the broadcasts, or of a
    tensor-parallel save: this rank stops too instead of waiting for them (``failures``:
    global rank → its error, as text); or the process group broke (a rank left:
    ``failures`` empty). ``committed``: the save's writer had committed the checkpoint
    complete before the failure (the message says so); else nothing was written."""

    def __init__(self, message: str, *, failures: "dict[int, str] | None" = None,
                 committed: bool = False):
        super().__init__(message)
        self.failures = dict(failures or {})
        self.committed = committed


class RenderError(WeightplanError, ValueError):
    """A plan can't be drawn as asked: unknown detail or format, a glob matching nothing, or
    the ``dot`` binary failed."""


class SaveError(WeightplanError, OSError):
    """A failure while saving; the target directory holds the old checkpoint intact, or
    (after a failure inside the commit) an interrupted save that loads refuse and
    ``weightplan recover DIR`` completes."""

    def __str__(self) -> str:
        return str(self.args[0])


class ConcurrentSaveError(SaveError):
    """Another save (or ``recover``) is writing the directory; names the holder."""


class ModelBuildError(WeightplanError, ValueError):
    """A model could not be built from a checkpoint directory's ``config.json``."""


class ArgumentError(WeightplanError, TypeError, ValueError):
    """A public function got an argument of the wrong type or value."""


class UnexpectedError(WeightplanError, RuntimeError):
    """An unexpected failure inside weightplan or a dependency, wrapped; please report it."""
