"""Bridges to other libraries' weight-loading conventions (optional dependencies).

* :mod:`weightplan.bridge.transformers` translates transformers' registered conversion
  mappings into weightplan transforms and ops, for families weightplan has no built-in
  mapping for;
* :mod:`weightplan.bridge.hub` builds an empty transformers model from a checkpoint
  directory's ``config.json`` (what ``weightplan explain CKPT_DIR`` uses).

Nothing here imports transformers at module import time: the core never needs it.
"""
