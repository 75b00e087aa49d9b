"""``weightplan explain DIR --tp N [--ep]``: every rank's figures from one process."""

import json

from weightplan.cli import main


def test_explain_tp_prints_one_row_per_rank(tp_checkpoints, capsys):
    assert main(["explain", str(tp_checkpoints["mixtral"]), "--tp", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("tensor parallel over 4 ranks (model.tp_plan)")
    assert [line.split()[0] for line in lines[2:6]] == ["0", "1", "2", "3"]


def test_explain_ep_json_rows_split_the_experts(tp_checkpoints, capsys):
    directory = str(tp_checkpoints["qwen3moe"])
    assert main(["explain", directory, "--tp", "2", "--ep", "--json"]) == 0
    ep = json.loads(capsys.readouterr().out)
    assert main(["explain", directory, "--tp", "2", "--json"]) == 0
    tp = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in ep] == [0, 1]
    # the same bytes either way, split differently: whole experts vs a slice of each
    assert sum(r["read_bytes"] for r in ep) == sum(r["read_bytes"] for r in tp)
    assert all(r["read_bytes"] == r["held_bytes"] for r in ep + tp)


def test_explain_tp_needs_a_model(tmp_path, capsys):
    from tests.conftest import write_checkpoint
    import torch

    ckpt = write_checkpoint(tmp_path / "c", {"w": torch.zeros(2)})
    assert main(["explain", str(ckpt), "--tp", "2"]) == 2
    assert "--tp needs the model" in capsys.readouterr().err
