"""One property for every path through phase 1: keys routed by template (the transforms
decided once per template, matches sliced out of the keys) route, group and fail exactly
as keys routed one by one, whichever way each step goes: a template or none (leading
zeros, transforms that tell digits apart), fix-ups or not, streams ordered run by run or
one by one, natural order from sort texts or from ``natural_key``."""

from unittest import mock

import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from weightplan import PrefixChange, WeightConverter, WeightRenaming
from weightplan.ops import Concatenate, MergeModulelist, Transpose
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.inputs.model_info import inspect_model
from weightplan.planner.keys import router
from weightplan.planner.keys.applier import apply
from weightplan.planner.keys.patterns import natural_key
from weightplan.planner.keys.route import route_checkpoint
from weightplan.planner.keys.transforms import Renaming

from tests.conftest import module_with

_STACKS = [MergeModulelist(0), Concatenate(1)]
_TRANSFORMS = [
    WeightRenaming(".block_sparse_moe.", ".mlp."),
    WeightRenaming(r"LayerNorm\.gamma$", "LayerNorm.weight"),
    WeightRenaming(r"layers\.(\d+)\.", r"blocks.\1."),
    WeightRenaming(r"e\.(\d+)\.x\.(\d+)", r"e.\2.x.\1"),  # swaps digits the template can't
    WeightRenaming(r"layers\.1\.", "first."),  # tells digits apart: no template decides
    WeightRenaming("fc", "proj", scope_prefix="vision"),
    PrefixChange(prefix_to_add="model"),
    PrefixChange(prefix_to_remove="model"),
    WeightConverter([".experts.*.w1", ".experts.*.w3"], ".experts.gate_up", _STACKS),
    WeightConverter(".experts.*.w2", ".experts.down", [MergeModulelist(0)]),
    WeightConverter([r"blocks\.(\d+)\.e\.*\.a", r"blocks\.(\d+)\.e\.*\.b"], r"blocks.\1.ab",
                    _STACKS),
    WeightConverter(r"e\.*\.x\.\d", "e.x", [MergeModulelist(0)]),  # a digit after the index
    WeightConverter(r"experts\.\d+\.w2", "experts.down", [MergeModulelist(0)]),  # no index
    WeightConverter("fc", "proj", [Transpose()], scope_prefix="vision"),
    # literal digits inside names (decided by template), and renamings moving the digits
    # keys differ in into names, where those literals could tell them apart
    WeightConverter(r"experts\.*\.w1\.weight$", "experts.w1_stack", [MergeModulelist(0)]),
    WeightRenaming(r"layers\.(\d+)\.", r"layer\1."),
    WeightRenaming(r"\.(\d+)\.w(\d)", r".\2.w\1"),
    WeightRenaming(r"layer1\.", "layer.first."),
    WeightConverter(r"\.w3$", ".w_up", [Transpose()]),
    WeightRenaming(r"fc2\.(\d+)", r"fc2_\1"),
]
_NUMBERS = st.sampled_from(["0", "1", "2", "3", "9", "10", "11", "00", "01", "007"])
_WORDS = st.sampled_from(["layers", "experts", "mlp", "block_sparse_moe", "LayerNorm",
                          "gamma", "weight", "model", "blocks", "e", "x", "a", "b", "w1",
                          "w2", "w3", "vision", "fc", "fc2", "layer1"])
_KEY = st.lists(st.one_of(_WORDS, _NUMBERS), min_size=1, max_size=5).map(".".join)


@st.composite
def _experts(draw):
    """A grid of expert keys, maybe with a hole or under other names."""
    layers = draw(st.lists(_NUMBERS, min_size=1, max_size=3, unique=True))
    count = draw(st.integers(1, 12))
    parts = draw(st.sampled_from([["w1", "w2", "w3"], ["w1", "w3"], ["w2"], ["w1"]]))
    head = draw(st.sampled_from(["", "model."])) + "layers"
    moe = draw(st.sampled_from(["mlp", "block_sparse_moe"]))
    tail = draw(st.sampled_from(["", ".weight"]))
    return [f"{head}.{i}.{moe}.experts.{e}.{p}{tail}" for i in layers for e in range(count)
            for p in parts]


@st.composite
def _case(draw):
    keys = draw(st.lists(_KEY, min_size=1, max_size=8))
    if draw(st.integers(0, 3)):
        keys += draw(_experts())
    # one key per natural_key: "0" and "00" tie, and ties keep the order keys came in
    keys = list({natural_key(k): k for k in reversed(keys)}.values())
    if len(keys) > 1 and not draw(st.integers(0, 3)):
        keys.remove(draw(st.sampled_from(keys)))  # a hole somewhere
    keys = draw(st.permutations(keys))
    transforms = draw(st.sampled_from([tuple(_TRANSFORMS[8:10]), (_TRANSFORMS[9],), ()]))
    transforms += tuple(draw(st.lists(st.sampled_from(_TRANSFORMS), max_size=4)))
    transforms = list({id(t): t for t in transforms}.values())
    names = None
    if draw(st.booleans()):  # a model: some keys as they are, renamed or prefixed, fused
        picked = draw(st.lists(st.sampled_from(keys), max_size=6)) if keys else []
        names = {draw(st.sampled_from([k, "model." + k, k.replace("block_sparse_moe", "mlp")]))
                 for k in picked}
        names |= {f"{p}layers.{i}.mlp.experts.{w}" for p in ("", "model.") for i in ("0", "1")
                  for w in ("gate_up", "down") if draw(st.booleans())}
    return keys, transforms, names


def _model(names):
    """The model holding ``names`` (a name that is another's module is left out)."""
    if names is None:
        return None
    kept = [n for n in names if not any(o.startswith(n + ".") for o in names)]
    model = module_with({n: ((1,), torch.float32) for n in kept})
    model.base_model_prefix = "model"
    return inspect_model(model)


def _outcome(keys, transforms, model):
    try:
        return route_checkpoint(open_checkpoint({k: torch.zeros(1) for k in keys}), transforms,
                                model)
    except Exception as e:  # noqa: BLE001 (the error itself is what is compared)
        return type(e), str(e)


@settings(max_examples=300, deadline=None)
@given(_case())
def test_routing_by_template_equals_routing_key_by_key(case):
    keys, transforms, names = case
    model = _model(names)
    by_template = _outcome(keys, transforms, model)
    with mock.patch.object(router, "templates_of", lambda keys: [None] * len(keys)):
        key_by_key = _outcome(keys, transforms, model)
    assert by_template == key_by_key
    if isinstance(by_template, tuple):
        event(f"raises {by_template[0].__name__}")
    else:
        kinds = sorted({"converter" if g.converter else "plain" for g in by_template.groups})
        event(f"groups: {kinds}; incomplete: {bool(by_template.incomplete)}; "
              f"notes: {any(r.note for r in by_template.routes)}")
    if model is None and not isinstance(by_template, tuple):  # the rule, key by key
        renamings = [t for t in transforms if isinstance(t, Renaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        assert list(by_template.routes) == [apply(r.key, renamings, converters)
                                            for r in by_template.routes]
