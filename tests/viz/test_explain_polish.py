"""Small defects of the explain surface (a user's list): a tie said in text and JSON, the
repr in human units, the JSON's steps as the text counts them, a mismatched row's bytes as
its node shows them, the no-dot warning escaped."""

import json

import pytest
import torch

import weightplan
from weightplan.cli import main


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    import transformers

    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2,
                                      vocab_size=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tied")
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def test_a_tie_is_a_note_in_text_and_json(tied_dir, capsys):
    import transformers

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_pretrained(tied_dir))
    plan = weightplan.explain(model, tied_dir)
    said = "lm_head.weight and model.embed_tokens.weight are one tensor; loaded once"
    assert said in str(plan)
    assert {"key": "lm_head.weight", "message": said} in plan.to_dict()["notes"]
    assert main(["explain", str(tied_dir), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(n["key"] == "lm_head.weight" and "one tensor" in n["message"] for n in notes)


def test_the_repr_says_the_peak_in_human_units(tied_dir):
    from weightplan.units import format_bytes

    import transformers

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_pretrained(tied_dir))
    plan = weightplan.explain(model, tied_dir)
    assert plan.peak_bytes >= 1024  # (so raw bytes and human units differ)
    assert f", peak {format_bytes(plan.peak_bytes)}, " in repr(plan), repr(plan)
    assert f"{plan.peak_bytes} B" not in repr(plan)
    assert f"peak estimate: {format_bytes(plan.peak_bytes)}" in str(plan)  # (as the text says it)


def test_the_json_says_the_step_the_text_says(tied_dir, capsys):
    import re

    assert main(["explain", str(tied_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert main(["explain", str(tied_dir)]) == 0
    number, of = map(int, re.search(r"peak estimate: .* at step (\d+)/(\d+) ",
                                    capsys.readouterr().out).groups())
    at = data["peak_at"]
    assert (at["number"], at["of"], at["step"]) == (number, of, number - 1)
    assert data["steps"] == of
    assert {e["number"] - e["step"] for e in data["timeline"]} == {1}
    assert max(e["number"] for e in data["timeline"]) == of


def test_a_mismatched_row_says_the_bytes_its_node_says():
    import re

    from tests.viz.plans import small_plan
    from weightplan.viz.dot import to_dot

    plan = small_plan()
    row = next(line for line in str(plan).splitlines() if "model.norm.weight" in line)
    said = re.search(r"f32\[2\]  (\d+ \w?B)  mismatch$", row)
    assert said is not None, row
    node = next(line for line in to_dot(plan).splitlines() if "mismatch: the model has" in line)
    assert f"assign f32[2] · {said.group(1)} · " in node, (row, node)
    assert said.group(1) == "8 B"  # (two f32: what it would assign; execute refuses it)
    unexpected = next(line for line in str(plan).splitlines() if "model.stray.bias" in line)
    assert unexpected.endswith("f32[1]  0 B  unexpected")  # (never read, never drawn)


def test_the_no_dot_warning_escapes_the_path(tmp_path, monkeypatch):
    from tests.viz.plans import small_plan
    from weightplan.viz import dot as dot_module

    monkeypatch.setattr(dot_module, "find_dot", lambda: None)
    path = tmp_path / "p\nforged\x1b]0;owned\x07.svg"
    with pytest.warns(UserWarning) as caught:
        written = small_plan().render(path)
    assert written == str(path.with_suffix(".dot"))
    message = str(caught[0].message)
    assert "\n" not in message and "\x1b" not in message and "\x07" not in message, message
    assert "p\\nforged\\x1b]0;owned\\x07.dot" in message, message
