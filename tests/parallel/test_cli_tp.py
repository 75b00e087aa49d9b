"""``weightplan explain DIR --tp N [--ep]``: every rank's figures from one process."""

import json

from tests.parallel.plans import experts_split_plan
from weightplan.cli import _model_for, main


def test_explain_tp_prints_one_row_per_rank(tp_checkpoints, capsys):
    # (4 key/value heads: the tiny Mixtral's 2 can't run on 4 ranks, exit 1)
    assert main(["explain", str(tp_checkpoints["llama4kv"]), "--tp", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("tensor parallel over 4 ranks (model.tp_plan)")
    assert [line.split()[0] for line in lines[2:6]] == ["0", "1", "2", "3"]


def test_explain_ep_json_rows_split_the_experts(tp_checkpoints, capsys):
    directory = str(tp_checkpoints["qwen3moe"])
    assert main(["explain", directory, "--tp", "2", "--ep", "--json"]) == 0
    ep = json.loads(capsys.readouterr().out)
    split = experts_split_plan(_model_for(directory, None)[0])  # (5.25's tp_plan keeps them whole)
    assert main(["explain", directory, "--tp", "2", "--tp-plan", json.dumps(split), "--json"]) == 0
    tp = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in ep] == [0, 1]
    # the same bytes either way, split differently: whole experts vs a slice of each
    assert sum(r["read_bytes"] for r in ep) == sum(r["read_bytes"] for r in tp)
    assert all(r["read_bytes"] == r["held_bytes"] for r in ep + tp)


def test_explain_tp_needs_a_model(tmp_path, capsys):
    from tests.conftest import write_checkpoint
    import torch

    ckpt = write_checkpoint(tmp_path / "c", {"w": torch.zeros(2)})
    assert main(["explain", str(ckpt), "--tp", "2"]) == 5
    assert "--tp needs the model" in capsys.readouterr().err


def test_repeated_tp_problems_fold_and_speak_in_flags(tp_checkpoints, capsys):
    assert main(["explain", str(tp_checkpoints["qwen3moe"]), "--tp", "3", "--ep"]) == 1
    out = capsys.readouterr().out
    parallel = [line for line in out.splitlines() if line.startswith("  parallel:")]
    assert len(parallel) == 1  # one line for both expert tensors
    assert "experts.down_proj" in parallel[0] and "experts.gate_up_proj" in parallel[0]
    assert "drop --ep, or give --tp a number dividing 4" in parallel[0]
    assert "experts='tp'" not in out
    assert main(["explain", str(tp_checkpoints["qwen3moe"]), "--tp", "3", "--ep",
                 "--allow-problems"]) == 0


def test_tp_says_what_every_rank_holds_whole_and_why(tp_checkpoints, capsys):
    assert main(["explain", str(tp_checkpoints["dsv3"]), "--tp", "2"]) == 0
    out = capsys.readouterr().out
    head, _, rest = out.partition("replicated (whole on every rank, ")
    assert rest, out
    reasons = rest.split("\n  ")
    assert reasons[1].startswith("no entry of model.tp_plan names them (")
    assert "self_attn.kv_a_proj_with_mqa.weight" in rest and "mlp.gate.weight" in rest
    assert main(["explain", str(tp_checkpoints["qwen3moe"]), "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert ("model.layers.*.self_attn.q_norm: replicated_with_grad_allreduce keeps them whole"
            in out)


def test_explain_tp_cooperative_json_rows_read_the_checkpoint_about_once(tp_checkpoints, capsys):
    directory = str(tp_checkpoints["dsv3"])  # its MLA attention is replicated
    assert main(["explain", directory, "--tp", "4", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["explain", directory, "--tp", "4", "--cooperative", "--json"]) == 0
    shared = json.loads(capsys.readouterr().out)
    assert main(["explain", directory, "--tp", "4", "--cooperative", "--nodes", "2",
                 "--storage", "node", "--json"]) == 0
    nodes = json.loads(capsys.readouterr().out)
    total = {way: sum(r["storage_bytes"] for r in rows)
             for way, rows in (("plain", plain), ("shared", shared), ("nodes", nodes))}
    assert total["shared"] < total["nodes"] < total["plain"]
    assert all(r["network_bytes"] == 0 for r in plain)
    assert all(r["network_bytes"] > 0 for r in shared + nodes)
    assert [r["held_bytes"] for r in shared] == [r["held_bytes"] for r in plain]


def test_explain_nodes_must_split_the_ranks(tp_checkpoints, capsys):
    assert main(["explain", str(tp_checkpoints["llama"]), "--tp", "4", "--cooperative",
                 "--nodes", "3"]) == 5
    assert "3 nodes: the 4 ranks" in capsys.readouterr().err


def test_a_head_cut_in_two_is_said_beside_the_rank_table(tp_checkpoints, capsys):
    """The dry run plans the bytes of a load over 4 ranks of 2 key/value heads, and says that
    loading it with ``tp=4`` is refused (transformers' forward can't reshape half a head): a
    problem for the exit status (1; ``--allow-problems`` 0), since the deployment can't run;
    over 2 ranks (or with 4 key/value heads) it says nothing."""
    assert main(["explain", str(tp_checkpoints["llama"]), "--tp", "4"]) == 1
    err = capsys.readouterr().err
    assert "problem: loading with tp=4 is refused" in err
    assert "num_key_value_heads=2 doesn't split over 4 ranks" in err
    assert "exit status 1" in err
    assert main(["explain", str(tp_checkpoints["llama"]), "--tp", "4", "--allow-problems"]) == 0
    capsys.readouterr()
    for name, ranks in (("llama", "2"), ("llama4kv", "4")):
        assert main(["explain", str(tp_checkpoints[name]), "--tp", ranks]) == 0
        assert "refused" not in capsys.readouterr().err
