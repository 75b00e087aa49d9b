"""The write direction: load records, reversed groups, shard layouts, write plans."""
