"""The FP8 fixture checkpoints, written once per test session."""

import pytest

from tests.fp8.checkpoints import build


@pytest.fixture(scope="session")
def fp8_checkpoints(tmp_path_factory):
    """``get(name) → (bf16 dir, fp8 dir)``; each family is written on first use."""
    root = tmp_path_factory.mktemp("fp8")
    return lambda name: build(name, root)
