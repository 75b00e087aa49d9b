"""Deliverable 6: every exception leaving weightplan is a WeightplanError naming what failed;
the CLI prints one line and exits non-zero (``--debug`` shows the traceback)."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

import weightplan
from weightplan.errors import ArgumentError, CheckpointError, PlanError, WeightplanError

from .helpers import entry, meta_model, raw_file, write

T = {"w": torch.ones(2)}


@pytest.fixture
def ckpt(tmp_path):
    save_file(T, str(tmp_path / "model.safetensors"))
    return tmp_path


CALLS = {
    "explain(str, ...)": lambda c: weightplan.explain("str", c),
    "explain(state_dict, ...)": lambda c: weightplan.explain({"w": torch.ones(2)}, c),
    "checkpoint as bytes": lambda c: weightplan.explain(None, bytes(str(c), "utf8")),
    "checkpoint list of bytes": lambda c: weightplan.explain(None, [b"x.safetensors"]),
    "checkpoint int": lambda c: weightplan.explain(None, 3),
    "NUL in path": lambda c: weightplan.explain(None, str(c) + "\x00x"),
    "name too long": lambda c: weightplan.explain(None, c / ("n" * 4096)),
    "budget nan": lambda c: weightplan.explain(None, c, budget=float("nan")),
    "budget inf": lambda c: weightplan.explain(None, c, budget=float("inf")),
    "budget huge string": lambda c: weightplan.explain(None, c, budget="9" * 400 + "GiB"),
    "budget list": lambda c: weightplan.explain(None, c, budget=[1]),
    "dtype list": lambda c: weightplan.explain(None, c, dtype=["bf16"]),
    "dtype object": lambda c: weightplan.explain(None, c, dtype=object()),
    "threads str": lambda c: weightplan.explain(None, c, threads="4"),
    "mapping int": lambda c: weightplan.explain(None, c, mapping=3),
    "unknown keyword": lambda c: weightplan.explain(None, c, bogus=1),
    "missing argument": lambda c: weightplan.explain(None),
    "load strict str": lambda c: weightplan.load(meta_model(T), c, strict="yes"),
    "save a dict": lambda c: weightplan.save({"w": torch.ones(2)}, c / "out"),
    "save to bytes": lambda c: weightplan.save(meta_model(T), b"out"),
    "save NUL": lambda c: weightplan.save(torch.nn.Linear(2, 2), str(c) + "\x00"),
    "save name too long": lambda c: weightplan.save(torch.nn.Linear(2, 2), c / ("n" * 4096)),
    "save shard nan": lambda c: weightplan.save(torch.nn.Linear(2, 2), c / "o",
                                                max_shard_size=float("nan")),
    "convert a list": lambda c: weightplan.convert([1, 2], "mixtral"),
    "revert None": lambda c: weightplan.revert(None, "mixtral"),
    "explain_convert bytes": lambda c: weightplan.explain_convert(c, b"x", mapping="mixtral"),
    "register_mapping None": lambda c: weightplan.register_mapping(None, None),
    "register_mapping not a list": lambda c: weightplan.register_mapping("k", None),
    "get_mapping a list": lambda c: weightplan.get_mapping(["x"]),
    "register_alias int": lambda c: weightplan.register_alias(1, "mixtral"),
    "render an int": lambda c: weightplan.explain(None, c).render(123),
    "render_timeline bytes": lambda c: weightplan.explain(None, c).render_timeline(b"x.svg"),
    "save into a FIFO": lambda c: (os.mkfifo(c / "fifo"),
                                   weightplan.save(torch.nn.Linear(2, 2), c / "fifo")),
    "explain a list holding a dir": lambda c: weightplan.explain(None, [str(c)]),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_misuse_is_typed(ckpt, name):
    with pytest.raises(WeightplanError) as info:
        CALLS[name](ckpt)
    assert str(info.value)


def test_argument_errors_say_the_fix(ckpt):
    with pytest.raises(ArgumentError, match=r"explain\(model, state_dict\)"):
        weightplan.explain({"w": torch.ones(2)}, ckpt)
    with pytest.raises(ArgumentError, match="checkpoint goes second"):
        weightplan.explain(str(ckpt), None)
    with pytest.raises(TypeError):  # ArgumentError is also a TypeError for old except clauses
        weightplan.explain(None, b"x")


def test_execute_errors_are_typed_and_name_the_file(ckpt):
    plan = weightplan.explain(meta_model(T), ckpt)
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(CheckpointError) as info:
        plan.execute()
    assert str(path) in str(info.value)


def test_header_errors_name_file_and_key(tmp_path):
    path = write(tmp_path / "m.safetensors", raw_file({"bad.key": entry("F32", [True], 0, 4)},
                                                       bytes(4)))
    with pytest.raises(CheckpointError) as info:
        weightplan.explain(None, path)
    assert info.value.file == str(path) and info.value.key == "bad.key"
    assert str(path) in str(info.value) and "bad.key" in str(info.value)


def test_budget_still_parses_numbers(ckpt):
    plan = weightplan.explain(None, ckpt, budget=1e9)
    assert plan.options.budget == 10**9
    with pytest.raises(PlanError, match="finite"):
        weightplan.explain(None, ckpt, budget=float("-inf"))


def test_cli_one_line_no_traceback_and_debug(tmp_path, capsys):
    from weightplan import cli

    bad = write(tmp_path / "model.safetensors", raw_file('{"a": ' + "[" * 5000 + "]" * 5000 + "}"))
    assert cli.main(["explain", str(bad)]) != 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "error" in x]
    assert len(lines) == 1 and "HeaderError" in lines[0] and str(bad) in lines[0]
    assert err.endswith(lines[0] + "\n") and "Traceback" not in err
    assert cli.main(["explain", str(bad), "--debug"]) != 0
    assert "Traceback" in capsys.readouterr().err
    assert cli.main(["--debug", "explain", str(tmp_path / "nope")]) != 0
    assert "Traceback" in capsys.readouterr().err


def test_cli_unexpected_errors_are_one_line_too(monkeypatch, capsys):
    from weightplan import cli

    def boom(args):
        raise ZeroDivisionError("surprise\nsecond line")

    monkeypatch.setattr(cli, "_dispatch", boom)
    assert cli.main(["mappings"]) == 6
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected ZeroDivisionError: surprise second line" in err


def test_unexpected_internal_errors_are_wrapped(ckpt, monkeypatch):
    from weightplan.errors import UnexpectedError
    from weightplan.planner.pipelines import load as explain_mod

    def boom(*a, **k):
        raise KeyError("internal")

    monkeypatch.setattr(explain_mod, "route_checkpoint", boom)
    with pytest.raises(UnexpectedError) as info:
        weightplan.explain(None, ckpt)
    assert isinstance(info.value.__cause__, KeyError)
