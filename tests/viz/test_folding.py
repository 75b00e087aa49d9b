"""Folding many keys at once (one regex pass over all of them) gives what folding them one
key at a time gives: the same templates, numbers, order and ranges, odd keys included."""

import itertools
import re

from hypothesis import given, settings, strategies as st

from weightplan.planner.keys.patterns import natural_key
from weightplan.viz.folding import (
    _by_shape, _one_number, fold_keys, fold_tuples, ranges, shapes_of, split_numbers,
)


def one_at_a_time(keys: list[str]) -> list[str]:
    """The reference: each key split on its own, rows folded by recursion."""
    templates: dict[tuple, list[tuple[int, ...]]] = {}
    first_key: dict[tuple, str] = {}
    for key in keys:
        template, numbers = split_numbers(key)
        templates.setdefault(template, []).append(numbers)
        first_key.setdefault(template, key)
    folded = []
    for template in sorted(templates, key=lambda t: natural_key(first_key[t])):
        for labels in recursive(sorted(set(templates[template]))):
            it = iter(labels)
            folded.append(".".join(p if p is not None else next(it) for p in template))
    return folded


def recursive(rows: list[tuple[int, ...]]) -> list[tuple[str, ...]]:
    """fold_tuples without its every-combination shortcut."""
    if not rows or not rows[0]:
        return [()]
    by_first: dict[int, list[tuple[int, ...]]] = {}
    for row in rows:
        by_first.setdefault(row[0], []).append(row[1:])
    by_rest: dict[tuple, list[int]] = {}
    for first, rest in by_first.items():
        by_rest.setdefault(tuple(sorted(recursive(rest))), []).append(first)
    return [(ranges(firsts), *r) for folded, firsts in by_rest.items() for r in folded]


# components that make keys awkward: numbers with leading zeros, empty components, digits
# inside names, a trailing newline, the separator the joined pass uses
PARTS = ["model", "layers", "experts", "w1", "gate_proj", "weight", "0", "3", "12", "007", "",
         "x\n", "5\n", "a\x01b", "9"]
keys_strategy = st.lists(st.lists(st.sampled_from(PARTS), min_size=1, max_size=6)
                         .map(".".join), max_size=12)


@settings(max_examples=400, deadline=None)
@given(keys_strategy)
def test_fold_keys_matches_one_key_at_a_time(keys):
    assert fold_keys(keys) == one_at_a_time(keys)


@settings(max_examples=400, deadline=None)
@given(keys_strategy)
def test_shapes_tell_templates_apart(keys):
    shapes = shapes_of(keys)
    templates = [split_numbers(k)[0] for k in keys]
    for (s1, t1), (s2, t2) in itertools.combinations(zip(shapes, templates, strict=True), 2):
        assert (s1 == s2) == (t1 == t2)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=16))
def test_fold_tuples_matches_the_recursion(rows):
    rows = sorted(set(rows))
    assert fold_tuples(rows) == recursive(rows)


def test_layers_times_experts_is_one_line_whatever_the_order():
    keys = [f"model.layers.{layer}.mlp.experts.{e}.{w}_proj.weight"
            for e in range(256) for layer in range(3, 61) for w in ("gate", "up")]
    assert fold_keys(keys) == ["model.layers.{3..60}.mlp.experts.{0..255}.gate_proj.weight",
                               "model.layers.{3..60}.mlp.experts.{0..255}.up_proj.weight"]
    assert fold_keys(keys) == one_at_a_time(keys)


# streams as a stack's are (one number varying), and odd ones that only look so
NUMBERS = ["0", "1", "2", "3", "9", "10", "11", "007", "7", "٣", "1\n", ""]
stream_strategy = st.one_of(
    st.tuples(st.lists(st.sampled_from(PARTS), max_size=4).map(".".join),
              st.lists(st.sampled_from(NUMBERS), min_size=1, max_size=12),
              st.lists(st.sampled_from(PARTS), max_size=3).map(".".join))
    .map(lambda t: [".".join(p for p in (t[0], n, t[2]) if p or n == "") for n in t[1]]),
    keys_strategy)


@settings(max_examples=600, deadline=None)
@given(st.lists(stream_strategy, max_size=6))
def test_fold_keys_of_streams_matches_one_key_at_a_time(streams):
    """Both paths of fold_keys: a stream read whole (_one_number) or by the regex pass."""
    keys = list(itertools.chain.from_iterable(streams))
    assert fold_keys(*streams) == fold_keys(keys) == one_at_a_time(keys)
    for stream in streams:
        one = _one_number(stream)
        if one is not None:  # read whole: the rows the regex pass finds, in its order
            shape, block = one
            assert _by_shape(stream) == {shape: (stream[0], block.rows())}


def test_fold_keys_reads_stacks_whole_and_folds_them_as_the_regex_pass():
    streams = [[f"model.layers.{layer}.mlp.experts.{e}.{w}_proj.weight" for e in range(256)]
               for layer in range(3, 61) for w in ("gate", "up")]
    streams.append([f"model.layers.3.mlp.experts.{e}.gate_proj.weight" for e in range(300, 310)])
    keys = list(itertools.chain.from_iterable(streams))
    assert _one_number(streams[0]) is not None and _one_number(keys) is None
    assert fold_keys(*streams) == fold_keys(keys) == one_at_a_time(keys)
    # one number of a stream not a whole component, two varying, a newline, a short
    # stream: the regex pass decides
    for odd in (["a.1b.w"] + [f"a.{i}.w" for i in range(9)],
                [f"a.{i}.{i % 2}.w" for i in range(9)], [f"a.{i}\n" for i in range(9)],
                [f"a.{i}.w" for i in range(3)]):
        assert _one_number(odd) is None
        assert fold_keys(odd) == one_at_a_time(odd)


def unfolded(lines: list[str]) -> list[str]:
    """The keys folded lines name: each ``{a..b,c}`` range expanded."""
    keys = []
    for line in lines:
        parts = re.split(r"\{([^{}]*)\}", line)
        choices = [[p] if i % 2 == 0 else
                   [str(v) for r in p.split(",")
                    for v in (range(int(r.split("..")[0]), int(r.split("..")[-1]) + 1))]
                   for i, p in enumerate(parts)]
        keys += ["".join(c) for c in itertools.product(*choices)]
    return keys


@settings(max_examples=600, deadline=None)
@given(st.lists(stream_strategy, max_size=6))
def test_folded_lines_name_exactly_the_keys(streams):
    """``layers.01`` and ``layers.1`` are two keys: a number with a leading zero is part of
    its name, not a number to fold (was: both read as 1, folded into ``layers.1`` alone)."""
    keys = list(itertools.chain.from_iterable(streams))
    assert sorted(unfolded(fold_keys(*streams))) == sorted(set(keys))


def test_a_leading_zero_is_not_folded_away():
    keys = [f"m.layers.{i}.w" for i in range(12)] + ["m.layers.01.w", "m.layers.007.w"]
    assert fold_keys(keys) == ["m.layers.{0..11}.w", "m.layers.01.w", "m.layers.007.w"]
    assert fold_keys(keys[:12], keys[12:]) == fold_keys(keys)
    padded = [f"m.layers.{i:02d}.w" for i in range(12)]  # a stack of 00..11: names kept
    assert sorted(unfolded(fold_keys(padded))) == sorted(padded)
