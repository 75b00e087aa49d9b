"""The planner: checkpoint headers → key routing → graph → verification → schedule.

Floors, lowest first, each importing only itself and the floors below it
(``tests/test_layers.py``): :mod:`.core` (specs, geometry, entries, ops, quantized-format
and shard math) < :mod:`.inputs` (headers, model inspection, pairing) < :mod:`.keys`
(patterns, transforms, registry, routing) < :mod:`.tensors` (ir < lower < schedule <
verify) < :mod:`.write` (the reverse) < :mod:`.pipelines` (load, save, convert).
"""
