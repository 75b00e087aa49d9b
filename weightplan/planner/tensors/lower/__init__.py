"""Lowering: each conversion of the graph becomes a step, its reads landing where the
graph puts their bytes (straight into the destination when every op places)."""
