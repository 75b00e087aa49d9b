"""The user-facing layer: plans that execute, print and draw themselves, and the entry
points that make them. It sits above the planner, the executor, viz and the bridge, so
nothing below imports it."""
