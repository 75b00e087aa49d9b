"""The graph and what runs: :mod:`.ir` (nodes, graph, build) < :mod:`.lower` (where each
byte lands: steps and reads) < :mod:`.schedule` (order, window, peak, budget) <
:mod:`.verify` (the invariants of the graph, the steps and the schedule)."""
