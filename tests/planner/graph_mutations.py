"""One way to break a node list, shared by the graph-proof property tests."""

import dataclasses


def mutated(nodes, i, j, how):
    """``nodes`` as a tuple with node ``i`` dropped, moved to ``j``, repeated at ``j``, or
    its first input rewired to node ``j`` (``how``); ``"none"``: unchanged."""
    nodes = list(nodes)
    if how == "drop":
        del nodes[i]
    elif how == "move":
        nodes.insert(j, nodes.pop(i))
    elif how == "repeat":
        nodes.insert(j, nodes[i])
    elif how == "rewire" and nodes[i].inputs:
        nodes[i] = dataclasses.replace(nodes[i], inputs=(nodes[j], *nodes[i].inputs[1:]))
    return tuple(nodes)
