"""A state machine: load, mutate parameters, save, reload — mutations survive in the
right checkpoint keys (checked against an independent legacy-layout writer)."""

import itertools
import tempfile
from pathlib import Path

import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from safetensors.torch import load_file

import weightplan

from tests.conftest import expected_moe, legacy_of, moe_checkpoint, moe_model, write_checkpoint

PARAMS = sorted(expected_moe(moe_checkpoint()))


class SaveLoadMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        self.root = Path(self._tmp.name)
        self.names = itertools.count()
        ckpt = moe_checkpoint()
        self.current = write_checkpoint(self.root / "start", ckpt, shards=2)
        self.saved = {k: v.clone() for k, v in expected_moe(ckpt).items()}
        self.model = None
        self.expected = None

    @rule()
    def load(self):
        self.model = moe_model()
        weightplan.load(self.model, self.current, mapping="mixtral", strict=True)
        self.expected = {k: v.clone() for k, v in self.saved.items()}

    @precondition(lambda self: self.model is not None)
    @rule(name=st.sampled_from(PARAMS), position=st.integers(0, 10_000),
          value=st.floats(-1e3, 1e3, allow_nan=False, width=32))
    def mutate(self, name, position, value):
        param = self.model.get_parameter(name)
        index = position % param.numel()
        with torch.no_grad():
            param.view(-1)[index] = value
        self.expected[name].view(-1)[index] = value

    @precondition(lambda self: self.model is not None)
    @rule(shard_size=st.sampled_from([200, 1000, 10**9]))
    def save(self, shard_size):
        out = self.root / f"save{next(self.names)}"
        weightplan.save(self.model, out, max_shard_size=shard_size)
        self.current = out
        self.saved = {k: v.clone() for k, v in self.expected.items()}

    @invariant()
    def disk_matches_the_last_save(self):
        on_disk = {}
        for f in sorted(Path(self.current).glob("*.safetensors")):
            on_disk.update(load_file(str(f)))
        want = legacy_of(self.saved)
        assert set(on_disk) == set(want)
        for key, value in want.items():
            assert torch.equal(on_disk[key], value), key

    def teardown(self):
        self._tmp.cleanup()


TestSaveLoad = SaveLoadMachine.TestCase
TestSaveLoad.settings = settings(max_examples=25, stateful_step_count=8, deadline=None)
