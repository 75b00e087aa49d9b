"""Renamings decided by template whose replaced text holds no number of the keys: each key's
name is the template's name with the key's numbers put back (``templates.Moves``), not the
renamings replayed per key. Property: the routes equal those made key by key, whether
the renamings take numbers (keys replay them), move them (longer or shorter text before
them, zero-width matches, lookarounds) or leave them alone."""

from unittest import mock

import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from weightplan import WeightConverter, WeightRenaming
from weightplan.ops import MergeModulelist
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.keys import router, templates
from weightplan.planner.keys.patterns import natural_key
from weightplan.planner.keys.route import route_checkpoint

_RENAMINGS = [
    WeightRenaming(".block_sparse_moe.", ".mlp."),
    WeightRenaming(r"^base_model\.model\.", ""),
    WeightRenaming(r"\.(lora_A|lora_B)\.(weight|bias)$", r".\1.default.\2"),
    WeightRenaming(r"layers\.(\d+)\.", r"blocks.\1."),  # captures a number
    WeightRenaming(r"experts\.\d+\.w", "experts.w"),  # replaces one
    WeightRenaming(r"^(model\.layers\.\d\.mlp)\.gate$", r"\1.base_layer.gate"),
    WeightRenaming("mlp", "feed_forward"),  # longer text before numbers
    WeightRenaming(r"^model\.", "m."),  # shorter
    WeightRenaming(r"\.x$", ""),
    WeightRenaming(r"^", "pre."),  # zero width, at the start
    WeightRenaming(r"(?=\.w)", ".inner"),  # zero width, before a name
    WeightRenaming(r"experts(?=\.\d)", "ex"),  # a number looked at, not taken
    WeightRenaming(r"(?<=\d)\.gate", ".router"),  # looked at behind
    WeightRenaming("gate", "gate", scope_prefix="model"),  # matches, changes nothing
]
_CONVERTER = WeightConverter([".experts.*.w1", ".experts.*.w3"], ".experts.gate_up",
                             [MergeModulelist(0)])
_NUMBERS = st.sampled_from(["0", "1", "2", "9", "10", "11", "23"])
_WORDS = st.sampled_from(["base_model", "model", "layers", "block_sparse_moe", "mlp",
                          "experts", "w1", "w3", "gate", "lora_A", "lora_B", "weight", "x"])


@st.composite
def _case(draw):
    heads = draw(st.lists(st.lists(st.one_of(_WORDS, _NUMBERS), min_size=1, max_size=4)
                          .map(".".join), min_size=1, max_size=3))
    tails = draw(st.lists(st.lists(_WORDS, min_size=1, max_size=3).map(".".join),
                          min_size=1, max_size=3))
    numbers = draw(st.lists(_NUMBERS, min_size=1, max_size=4, unique=True))
    keys = [f"{h}.{n}.{t}" for h in heads for n in numbers for t in tails]
    keys += draw(st.lists(st.lists(st.one_of(_WORDS, _NUMBERS), min_size=1, max_size=6)
                          .map(".".join), max_size=6))
    keys = list({natural_key(k): k for k in keys}.values())
    renamings = draw(st.lists(st.sampled_from(_RENAMINGS), min_size=1, max_size=5,
                              unique_by=id))
    return draw(st.permutations(keys)), [*renamings, *([_CONVERTER] * draw(st.booleans()))]


def _outcome(keys, transforms):
    try:
        return route_checkpoint(open_checkpoint({k: torch.zeros(1) for k in keys}),
                                transforms, None)
    except Exception as e:  # noqa: BLE001 (the error itself is what is compared)
        return type(e), str(e)


@settings(max_examples=300, deadline=None)
@given(_case())
def test_names_put_together_from_the_template_equal_the_renamings_replayed(case):
    keys, transforms = case
    used = []
    names = templates.Moves.names

    def counted(self, members):
        used.append(len(members))
        return names(self, members)

    with mock.patch.object(templates.Moves, "names", counted):
        by_template = _outcome(keys, transforms)
    with mock.patch.object(router, "templates_of", lambda keys: [None] * len(keys)):
        key_by_key = _outcome(keys, transforms)
    assert by_template == key_by_key
    event(f"names put together: {bool(used)}")


def test_moves_refuse_a_renaming_that_takes_a_number():
    moves = templates.Moves.of("model.layers.11.mlp.experts.1.w1")
    assert moves.spliced(_RENAMINGS[3], "model.layers.11.mlp.experts.1.w1") is None
    assert moves.spliced(_RENAMINGS[4], "model.layers.11.mlp.experts.1.w1") is None
    moved = moves.spliced(_RENAMINGS[6], "model.layers.11.mlp.experts.1.w1")
    assert moved is not None and moved.at == (13, 37)
    done = moved.to("model.layers.11.feed_forward.experts.1.w1")
    assert done.names(["model.layers.23.mlp.experts.7.w1"]) == [
        "model.layers.23.feed_forward.experts.7.w1"]
