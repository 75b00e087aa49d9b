"""``verify``: the invariants of a plan graph, of the steps lowered from it (every read,
every destination byte) and of the schedule's events."""
