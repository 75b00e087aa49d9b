"""Tensor and byte planning: specs, ops, geometry, the graph, placement, schedule, budget."""
