"""The executor: runs a plan's events with a thread pool of byte-range readers."""
