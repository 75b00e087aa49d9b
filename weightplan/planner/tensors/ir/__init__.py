"""The plan's graph: frozen nodes, the container, and the builder that makes them from
routed groups (ops resolved, every shape and dtype inferred)."""
