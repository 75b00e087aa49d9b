"""The planner: checkpoint headers → key routing → graph → verification → schedule."""
