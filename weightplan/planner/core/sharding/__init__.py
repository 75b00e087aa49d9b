"""Tensor and expert parallel math: placements, the styles transformers names, shard
regions, FP8 scale tiles under a shard, and the public configuration."""
