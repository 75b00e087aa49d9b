"""The write direction's parts: load records, reversed groups, shard layouts, FP8 saves."""
