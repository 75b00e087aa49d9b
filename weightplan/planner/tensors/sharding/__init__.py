"""Tensor and expert parallel planning: placements, shard math, plans, push-down."""
