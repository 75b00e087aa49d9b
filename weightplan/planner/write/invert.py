"""A loaded conversion read backwards: the group that writes its checkpoint tensors again.

A load is ``read (→ dequantize) → op … (→ cast | quantize | shard) → sink``; its record
(:class:`~weightplan.planner.write.record.RecordedConversion`) is read off those nodes.
Saving reads it backwards, node by node:

* each **sink** (a model tensor) becomes a source: the model's tensor at the sink's place
  in the last stage. A **shard** inverts to a gather: the source is the whole tensor,
  which the executor gathers from its ``DTensor`` as it reads it
  (:mod:`weightplan.executor.gather`), so it needs no node of its own;
* each **op** stage becomes its resolved op's inverse, last stage first (Chunk sizes and
  RoPE heads are the load's: ``op.inverse()`` of the resolved op);
* a **quantize** (a floating checkpoint loaded into FP8 parameters) becomes a dequantize of
  the model's weight with its scale (:func:`dequantizing`); a **dequantize** becomes the
  floating value at its recorded spec, or a quantize with the recorded block under
  ``quantize="fp8"`` (:mod:`.fp8_save`);
* each **read** becomes an output: the recorded checkpoint key and spec (a cast where the
  model holds another dtype).

Nothing is matched or routed: the result is a :class:`Group` holding the inverse op chain,
which the one builder turns into nodes, as for every plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from weightplan.errors import SaveError
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.inputs.fp8_pairs import Fp8Pairing, ScaledWeight
from weightplan.planner.keys.routing import Group, Route
from weightplan.planner.tensors.ir.quant_build import QuantContext
from weightplan.planner.write.record import RecordedConversion

NOTE = "exact inverse of the recorded load"


def invert(recorded: RecordedConversion, entries: Mapping[str, TensorEntry]) -> Group:
    """The group that turns the model's tensors (``entries``, by name) back into
    ``recorded``'s checkpoint tensors.

    Raises:
        SaveError: the model no longer has a tensor the record says it loaded.
    """
    places: dict[int, dict[int, str]] = {}
    for key, (i, j) in recorded.targets:  # sink → source, at its place in the last stage
        places.setdefault(i, {})[j] = key
    try:
        sources = tuple(tuple(entries[places[i][j]] for j in sorted(places[i]))
                        for i in sorted(places))
    except KeyError as e:
        raise SaveError(f"the model no longer has {e.args[0]}, which the load record says "
                        f"holds {', '.join(recorded.keys[:3])}") from e
    outputs = tuple(tuple(k for k, _ in stream) for stream in recorded.sources)  # read → sink
    note = NOTE + (f" ({'; '.join(r.describe() for r in recorded.fired)})"
                   if recorded.fired else "")
    routes = tuple(tuple(Route(e.key, e.key, (), note=note) for e in s) for s in sources)
    ops = tuple(op.inverse() for op in reversed(recorded.ops))  # op → inverse, last first
    return Group(None, sources, routes, tuple(s[0] for s in outputs), outputs, operations=ops)


def dequantizing(recorded: Iterable[RecordedConversion], entries: Mapping[str, TensorEntry]
                 ) -> QuantContext | None:
    """Quantize → dequantize: the model's FP8 weights a load quantized, each paired with
    its scale parameter, for the builder to dequantize (``None``: there are none)."""
    try:
        pairs = {weight: ScaledWeight(entries[weight], entries[scale], block)
                 for r in recorded for weight, scale, block in r.quantized}
    except KeyError as e:
        raise SaveError(f"the model no longer has {e.args[0]}, which the load record says "
                        "holds an FP8 weight or its scale") from e
    if not pairs:
        return None
    companions = frozenset(p.scale.key for p in pairs.values())
    return QuantContext(Fp8Pairing(pairs, (), companions), None, None)
