"""``device_map="auto"`` with a ``max_memory`` too small for even the first module: the
whole model goes to the disk (read back at every forward), and the plan says so in a note
(text, JSON, ``weightplan explain``) with the budget that would keep that module resident
(was: a devices table with nothing on the CPU and ``kept`` "-", without a word)."""

from __future__ import annotations

import re

import pytest
import torch

import weightplan
from weightplan.cli import main
from weightplan.units import parse_bytes

HEAD = "max_memory leaves nothing resident"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    import transformers

    directory = tmp_path_factory.mktemp("resident")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )).save_pretrained(directory)
    return directory


def plan(directory, cpu: str | int):
    from transformers import AutoConfig, AutoModelForCausalLM

    with weightplan.init_empty():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    return weightplan.explain(model, directory, device_map="auto", max_memory={"cpu": cpu})


def resident(p) -> int:
    return sum(u.weights for u in p.options.placement.uses if u.device != "disk")


def the_note(p) -> str:
    notes = [n.message for n in p.notes if n.key == "max_memory"]
    assert len(notes) == 1, p.notes
    return notes[0]


def test_a_budget_that_keeps_nothing_says_so_and_what_would(llama):
    p = plan(llama, "1KiB")
    assert resident(p) == 0
    note = the_note(p)
    assert note.startswith(HEAD), note
    assert "model.embed_tokens" in note and "cpu" in note and "1 KiB" in note, note
    need = parse_bytes(re.search(r"a budget of (\d+) bytes \(\S+ KiB\) for cpu in max_memory", note).group(1))
    assert resident(plan(llama, need)) > 0  # that budget keeps the module
    assert resident(plan(llama, need - 1)) == 0  # and is the smallest that does
    assert any(n["key"] == "max_memory" and n["message"] == note
               for n in p.to_dict()["notes"])
    assert HEAD in str(p)


def test_a_budget_that_keeps_something_has_no_note(llama):
    p = plan(llama, "100KiB")
    assert resident(p) > 0 and not [n for n in p.notes if n.key == "max_memory"]


def test_the_cli_explains_it(llama, capsys):
    assert main(["explain", str(llama), "--device-map", "auto", "--max-memory", "cpu=1KiB"]) == 0
    out = capsys.readouterr().out
    assert "--max-memory leaves nothing resident: model.embed_tokens" in out, out
    assert re.search(r"a budget of \d+ bytes \(\S+ KiB\) for cpu in --max-memory keeps it "
                     "resident", out), out
