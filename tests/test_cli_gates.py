"""The command line as a CI gate and a converter: exit statuses, CLI wording, ``convert``'s
model directory, ``mappings --json``, the help texts."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import weightplan
from weightplan.cli import build_parser, main

from tests.conftest import moe_checkpoint, write_checkpoint
from tests.interop.matrix import FAMILIES, output


def saved(family, directory):
    cls, cfg, inputs = FAMILIES[family]()
    torch.manual_seed(0)
    cls(cfg).save_pretrained(directory)
    return cls, inputs


@pytest.fixture(scope="module")
def llama_with_problems(tmp_path_factory):
    """A llama checkpoint with one tensor missing and one of the wrong shape."""
    directory = tmp_path_factory.mktemp("broken")
    saved("llama", directory)
    tensors = load_file(str(directory / "model.safetensors"))
    del tensors["model.norm.weight"]
    tensors["lm_head.weight"] = tensors["lm_head.weight"][:-1].clone()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def test_problems_exit_1_and_allow_problems_exits_0(llama_with_problems, capsys):
    directory = str(llama_with_problems)
    assert main(["explain", directory]) == 1
    captured = capsys.readouterr()
    assert "missing (1): model.norm.weight" in captured.out and "mismatch (1)" in captured.out
    assert "exit status 1" in captured.err and "--allow-problems" in captured.err
    assert main(["explain", directory, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["problems"]
    assert main(["explain", directory, "--allow-problems"]) == 0


def test_a_clean_plan_exits_0_and_an_error_2(tmp_path, capsys):
    saved("llama", tmp_path / "ok")
    assert main(["explain", str(tmp_path / "ok")]) == 0
    assert "problems: none" in capsys.readouterr().out
    assert main(["explain", str(tmp_path / "nothing-here")]) == 3


def test_the_exit_statuses_are_documented():
    epilog = build_parser().epilog
    for status in ("0 ", "1 ", "2 ", "120", "130", "143"):
        assert f"\n    {status}" in epilog
    assert "--allow-problems" in epilog


def test_a_model_without_tp_plan_gets_cli_advice(tmp_path, capsys):
    saved("bert", tmp_path / "bert")
    assert main(["explain", str(tmp_path / "bert"), "--tp", "2"]) == 1
    out = capsys.readouterr().out
    assert "the model has no tp_plan: pass --tp-plan" in out and "TensorParallel(" not in out


def test_the_rank_json_says_why_the_status_is_1(tmp_path, capsys):
    """``--tp N --json`` exits 1 on problems: each rank's row lists them (the plan's own,
    and a deployment that can't run), as the table and plain ``--json`` do."""
    saved("bert", tmp_path / "bert")
    assert main(["explain", str(tmp_path / "bert"), "--tp", "2", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in rows] == [0, 1]
    assert all(any("has no tp_plan" in p["message"] and p["kind"] == "parallel"
                   for p in r["problems"]) for r in rows), rows
    saved("llama", tmp_path / "llama")
    assert main(["explain", str(tmp_path / "llama"), "--tp", "3", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert all(any("doesn't split over 3 ranks" in p["message"] for p in r["problems"])
               for r in rows), rows


def test_a_tp_plan_given_on_the_command_line(tmp_path, capsys):
    saved("bert", tmp_path / "bert")
    plan = {"bert.encoder.layer.*.intermediate.dense": "colwise", "nothing.*": "rowwise"}
    assert main(["explain", str(tmp_path / "bert"), "--tp", "2", "--tp-plan",
                 json.dumps(plan)]) == 1
    out = capsys.readouterr().out
    assert "(the plan given)" in out and "'nothing.*' (rowwise) matches no module" in out
    (tmp_path / "plan.json").write_text(json.dumps({k: v for k, v in plan.items() if "*" in k
                                                    and "nothing" not in k}))
    assert main(["explain", str(tmp_path / "bert"), "--tp", "2", "--tp-plan",
                 f"@{tmp_path / 'plan.json'}"]) == 0
    assert main(["explain", str(tmp_path / "bert"), "--tp", "2", "--tp-plan", "[1]"]) == 2
    assert "ArgumentError: --tp-plan" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["explain", str(tmp_path / "bert"), "--tp", "0"])


def test_convert_writes_a_model_directory_from_the_config_model_type(tmp_path, capsys):
    cls, inputs = saved("mixtral", tmp_path / "src")
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "src"), str(out), "--max-shard-size", "40KB"]) == 0
    text = capsys.readouterr().out
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 1 and (out / "config.json").is_file()
    assert (out / "generation_config.json").is_file()
    # the plan's header and the report count the same files
    assert f"({len(files)} files + index, " in text
    assert f"in {len(files)} files + index + config.json + generation_config.json in" in text
    reference = cls.from_pretrained(tmp_path / "src")
    loaded = weightplan.from_pretrained(out)
    assert torch.equal(output(loaded, inputs), output(reference, inputs))


def test_convert_wording_and_the_refused_config(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "src", moe_checkpoint())
    assert main(["convert", str(src), str(tmp_path / "o")]) == 5
    assert "names a model_type" in capsys.readouterr().err
    assert main(["convert", str(src), str(tmp_path / "o"), "--model-type", "mixtral"]) == 0
    assert main(["convert", str(src), str(tmp_path / "o"), "--model-type", "mixtral"]) == 5
    err = capsys.readouterr().err
    assert "pass --overwrite" in err and "overwrite=True" not in err
    saved("llama", tmp_path / "llama")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}")
    assert main(["convert", str(tmp_path / "llama"), str(tmp_path / "mine")]) == 5
    assert "config.json exists and differs" in capsys.readouterr().err
    assert (tmp_path / "mine" / "config.json").read_text() == "{}"


def test_mappings_json_lists_what_the_text_lists(capsys):
    assert main(["mappings"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert main(["mappings", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(text) and [r["name"] for r in rows] == [t.split()[0] for t in text]
    mixtral = next(r for r in rows if r["name"] == "mixtral")
    assert mixtral == {"name": "mixtral", "alias_of": None, "source": "registry"}
    assert any(r["alias_of"] for r in rows)


def test_every_convert_option_says_what_it_takes():
    convert = build_parser()._subparsers._group_actions[0].choices["convert"]
    helps = {a.dest: a.help for a in convert._actions}
    assert helps["threads"] and "thread" in helps["threads"]
    assert "200KB" in helps["max_shard_size"] and "bytes per" not in helps["max_shard_size"]
    assert all(helps[a.dest] for a in convert._actions)
