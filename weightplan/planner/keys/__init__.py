"""Key mapping: patterns, transforms, the registry and its lookup, routing keys to converters."""
