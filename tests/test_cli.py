"""The command line: demo, explain with a registered mapping, JSON, typed errors."""

import json

from weightplan.cli import main

from tests.conftest import moe_checkpoint, write_checkpoint


def test_explain_with_model_type(tmp_path, capsys):
    directory = write_checkpoint(tmp_path / "c", moe_checkpoint(), shards=2)
    assert main(["explain", str(directory), "--model-type", "mixtral"]) == 0
    out = capsys.readouterr().out
    assert "→ model.layers.{0,1}.mlp.experts.gate_up_proj  f32[4, 12, 8] ×2" in out


def test_explain_json(tmp_path, capsys):
    directory = write_checkpoint(tmp_path / "c", moe_checkpoint())
    assert main(["explain", str(directory), "--model-type", "mixtral", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"] is None and data["read_bytes"] > 0


def test_errors_are_reported_not_raised(tmp_path, capsys):
    assert main(["explain", str(tmp_path / "missing.safetensors")]) == 3
    assert "CheckpointError" in capsys.readouterr().err
    assert main(["explain", str(tmp_path), "--model-type", "no_such_family"]) == 5


def test_demo_runs(tmp_path, capsys):
    assert main(["demo", "--dir", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "legacy rename LayerNorm" in out and "equal the original's: True" in out
    assert (tmp_path / "demo" / "model.safetensors.index.json").exists()
    assert main(["demo", "--dir", str(tmp_path / "demo")]) == 0  # (again: its own files)


def test_convert_forward_and_back_on_disk(tmp_path, capsys):
    import torch
    from safetensors.torch import load_file

    from tests.conftest import expected_moe
    ckpt = moe_checkpoint()
    src = write_checkpoint(tmp_path / "src", ckpt, shards=2)
    assert main(["convert", str(src), str(tmp_path / "fused"), "--model-type", "mixtral"]) == 0
    fused = load_file(str(tmp_path / "fused" / "model.safetensors"))
    want = expected_moe(ckpt)
    assert set(fused) == set(want) and all(torch.equal(fused[k], want[k]) for k in want)
    assert main(["convert", str(tmp_path / "fused"), str(tmp_path / "back"), "--model-type",
                 "mixtral", "--reverse", "--max-shard-size", "1000"]) == 0
    back = {}
    for f in (tmp_path / "back").glob("*.safetensors"):
        back.update(load_file(str(f)))
    # the legacy LayerNorm names are not part of the mapping: they stay in the model layout
    legacy = {k for k in ckpt if "LayerNorm" in k}
    assert {k for k in ckpt if k not in legacy} <= set(back)
    assert all(torch.equal(back[k], ckpt[k]) for k in ckpt if k not in legacy)
    assert "wrote" in capsys.readouterr().out


def test_convert_dry_run_writes_nothing(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "src", moe_checkpoint())
    assert main(["convert", str(src), str(tmp_path / "o"), "--model-type", "mixtral",
                 "--dry-run"]) == 0
    assert not (tmp_path / "o").exists()
    assert "weightplan convert" in capsys.readouterr().out


def test_explain_with_budget(tmp_path, capsys):
    directory = write_checkpoint(tmp_path / "c", moe_checkpoint())
    assert main(["explain", str(directory), "--model-type", "mixtral", "--budget", "1MiB"]) == 0
    assert "budget 1 MiB" in capsys.readouterr().out
    assert main(["explain", str(directory), "--model-type", "mixtral", "--budget", "10B"]) == 5
    err = capsys.readouterr().err
    assert "BudgetError" in err and "smallest possible peak" in err
    assert status(["explain", str(directory), "--model-type", "mixtral", "--budget", "lots"]) == 2
    assert "can't parse --budget" in capsys.readouterr().err


def test_the_program_prints_everything_before_it_leaves(tmp_path, capsys):
    """``weightplan explain`` leaves without the interpreter's teardown: what it printed
    is flushed first, the exit status is kept, and output is what ``main`` prints."""
    from tests.hostile.helpers import run_cli

    directory = write_checkpoint(tmp_path / "c", moe_checkpoint(), shards=2)
    assert main(["explain", str(directory), "--model-type", "mixtral", "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    done = run_cli("explain", str(directory), "--model-type", "mixtral", "--json")
    assert done.returncode == 0 and done.stdout.endswith("}\n")
    got = json.loads(done.stdout)
    for data in (got, expected):  # the memory available now is the one figure that moves
        data["machine"].pop("available_bytes")
    assert got == expected
    failed = run_cli("explain", str(tmp_path / "missing.safetensors"))
    assert failed.returncode == 3 and "CheckpointError" in failed.stderr


def test_the_command_pauses_the_collector_before_torch_is_imported():
    """``import weightplan`` (what the ``weightplan`` script does first) imports neither
    torch nor the planner, so the command disables the collector before their imports
    (a quarter of a second of collections while torch and transformers load)."""
    import subprocess
    import sys

    probe = ("import sys, weightplan, weightplan.cli\n"
             "print(sorted(m for m in ('torch', 'transformers', 'weightplan.planner') "
             "if m in sys.modules))\n"
             "print(weightplan.explain.__name__, weightplan.ops.Chunk.__name__)\n"
             "print(all(getattr(weightplan, name) is not None for name in weightplan.__all__))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    assert done.stdout.splitlines() == ["[]", "explain Chunk", "True"]


def test_builtin_mappings_are_registered_whatever_is_imported_first():
    import subprocess
    import sys

    for first in ("weightplan.planner.keys.registry", "weightplan.planner.keys.mappings",
                  "weightplan.planner.pipelines.load"):
        probe = (f"import {first}\nfrom weightplan.planner.keys.mappings import REGISTRY\n"
                 "print('mixtral' in REGISTRY, 'deepseek_v3' in REGISTRY)")
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              check=True)
        assert done.stdout.split() == ["True", "True"], first


def test_a_reader_that_leaves_early_is_not_an_error():
    """``weightplan mappings | head -1``: the closed pipe stops the command quietly."""
    import os
    import subprocess
    import sys

    from tests.hostile.helpers import REPO

    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "weightplan.cli", "mappings"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 120
    assert err == ""


def test_the_demo_says_its_temporary_checkpoint_is_gone(capsys):
    import tempfile

    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert "temporary directory" in first and "deleted" in first
    assert tempfile.gettempdir() not in out  # no path printed to a directory that is gone
    assert "<a temporary directory>" in out.splitlines()[2]  # the plan's header names it
    assert "temporary checkpoint is deleted" in out.splitlines()[-1]
    assert "--dir DIR" in out.splitlines()[-1]


def test_merge_without_an_adapter_says_what_to_do(tmp_path, capsys):
    directory = write_checkpoint(tmp_path / "c", moe_checkpoint())
    assert main(["explain", str(directory), "--model-type", "mixtral", "--merge"]) == 2
    err = capsys.readouterr().err
    assert "ArgumentError" in err and "--merge merges an adapter" in err


def test_a_hub_id_not_cached_is_told_the_way_out_in_the_command_lines_words(
        tmp_path, monkeypatch, capsys):
    """The way out was Python's (`pass local_files_only=True`), which the command line has
    no flag for: it says the environment variable instead."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert main(["explain", "no-org/no-model"]) == 3
    err = capsys.readouterr().err
    assert "HF_HUB_OFFLINE is set so the Hub was not asked" in err, err
    assert "then set HF_HUB_OFFLINE=1" in err and "local_files_only" not in err, err
    assert err.count("\n") == 1


def test_convert_dequantize_and_to_fp8_exclude_each_other(tmp_path, capsys):
    """--to fp8 won silently over --dequantize (FP8 written where bf16 was asked for)."""
    import pytest
    import torch

    import weightplan
    from weightplan.errors import ArgumentError

    directory = write_checkpoint(tmp_path / "c", {"w": torch.ones(2, 2)})
    assert main(["convert", str(directory), str(tmp_path / "out"), "--dequantize",
                 "--to", "fp8"]) == 2
    err = capsys.readouterr().err
    assert "--dequantize and --to fp8 exclude each other" in err, err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ArgumentError, match="dequantize=True and to='fp8' exclude each other"):
        weightplan.explain_convert(directory, tmp_path / "out", dequantize=True, to="fp8")


def test_convert_reverse_with_dequantize_or_to_is_refused(tmp_path, capsys):
    """--reverse was silently ignored beside --dequantize / --to fp8 (keys kept as they
    are): refused, in flags, nothing written."""
    import pytest
    import torch

    import weightplan
    from weightplan.errors import ArgumentError

    directory = write_checkpoint(tmp_path / "c", {"w": torch.ones(2, 2)})
    for flags, said in ((["--dequantize"], "--reverse and --dequantize exclude each other"),
                        (["--to", "fp8"], "--reverse and --to fp8 exclude each other")):
        assert main(["convert", str(directory), str(tmp_path / "out"), "--reverse",
                     *flags]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
        assert not (tmp_path / "out").exists()
    with pytest.raises(ArgumentError, match="reverse=True and dequantize=True exclude"):
        weightplan.explain_convert(directory, tmp_path / "out", reverse=True, dequantize=True)


def test_convert_reverse_with_nothing_to_reverse_says_so(tmp_path, capsys):
    """A checkpoint in the original layout has nothing to reverse: one line, exit 5, nothing
    written (was: every tensor copied as it is, exit 0), as --dequantize says of a
    checkpoint with nothing quantized; the model's layout still reverses."""
    import pytest

    import weightplan
    from weightplan.errors import PlanError

    legacy = write_checkpoint(tmp_path / "legacy", moe_checkpoint())
    assert main(["convert", str(legacy), str(tmp_path / "out"), "--model-type", "mixtral",
                 "--reverse"]) == 5
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1, err
    assert (f"PlanError: {legacy}: nothing to reverse: no key is in the layout the mapping "
            "'mixtral' converts to (this is the original one); --reverse turns a checkpoint "
            "in the model's layout back into the original one") in err, err
    assert not (tmp_path / "out").exists()
    with pytest.raises(PlanError, match="nothing to reverse: the mapping renames and converts "
                                        "nothing; reverse=True turns"):
        weightplan.explain_convert(legacy, tmp_path / "out", mapping=[], reverse=True)
    assert main(["convert", str(legacy), str(tmp_path / "fused"), "--model-type",
                 "mixtral"]) == 0
    assert main(["convert", str(tmp_path / "fused"), str(tmp_path / "back"), "--model-type",
                 "mixtral", "--reverse", "--dry-run"]) == 0


def status(argv):
    """``main(argv)``'s exit status, argparse's refusals (a ``SystemExit``) included."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_a_bad_size_or_count_is_named_as_its_flag(tmp_path, capsys):
    """(was: 'can't parse max_shard_size 'lots'', 'threads must be ...': the keywords)"""
    source = write_checkpoint(tmp_path / "c", moe_checkpoint())
    for args, says in (
            (["convert", str(source), str(tmp_path / "o"), "--model-type", "mixtral",
              "--max-shard-size", "lots"], "can't parse --max-shard-size 'lots'"),
            (["convert", str(source), str(tmp_path / "o"), "--model-type", "mixtral",
              "--threads", "-1"], "--threads must be a non-negative int, got -1"),
            (["explain", str(source), "--model-type", "mixtral", "--budget", "lots"],
             "can't parse --budget 'lots'")):
        assert status(args) == 2  # (bad arguments: refused by the parser, before any work)
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err


def test_the_help_says_what_every_command_does(capsys):
    """``weightplan --help`` opened with 'explain, convert, list mappings': the demo and
    ``recover`` (the way out of an interrupted save) were not among what it does."""
    import pytest

    with pytest.raises(SystemExit):
        main(["--help"])
    head = capsys.readouterr().out.split("positional arguments:")[0]
    description = " ".join(head.split("\n\n", 1)[1].split())
    for command in ("demo", "explain", "convert", "mappings", "recover"):
        assert command in description, description


def test_explain_dequantize_says_when_nothing_is_quantized(tmp_path, capsys):
    """Was: 'explain DIR --dequantize' on a checkpoint with nothing quantized said nothing,
    where 'convert --dequantize' says 'nothing to dequantize': explain plans it as it is
    (as from_pretrained(dequantize=True) loads it) and says the same in its note."""
    directory = write_checkpoint(tmp_path / "c", moe_checkpoint())
    assert main(["explain", str(directory), "--model-type", "mixtral", "--dequantize"]) == 0
    out, err = capsys.readouterr()
    assert "nothing to dequantize" in err and str(directory) in err, err
    assert "Traceback" not in err and "gate_up_proj" in out
    assert main(["explain", str(directory), "--model-type", "mixtral"]) == 0
    assert "nothing to dequantize" not in capsys.readouterr().err
