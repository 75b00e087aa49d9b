"""The planner's ground floor: what a tensor is at plan time (specs, entries, geometry),
conversion ops, quantized-format math, shard math, and the problem types plans report."""
