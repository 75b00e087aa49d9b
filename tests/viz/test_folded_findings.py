"""Shape mismatches and repeated notes fold by layer like missing / unexpected keys;
the command line has --version and a plain-text --help."""

import torch
from torch import nn

import weightplan
from weightplan.cli import main


def layers(n: int, rows: int) -> nn.Module:
    model = nn.Module()
    model.layers = nn.ModuleList(nn.Linear(4, rows, bias=False) for _ in range(n))
    return model


def test_mismatches_fold_into_one_line_per_shape_pair():
    state = {f"layers.{i}.weight": torch.zeros(3, 4) for i in range(8)}
    text = str(weightplan.explain(layers(8, 5), state))
    lines = [line for line in text.splitlines() if line.startswith("  mismatch")]
    assert lines == ["  mismatch (8): layers.{0..7}.weight: checkpoint gives [3, 4] but the "
                     "model has [5, 4]"]


def test_repeated_notes_fold_by_layer():
    model = layers(6, 4)
    model._keys_to_ignore_on_load_unexpected = [r"\.old$"]  # as transformers models declare
    state = {f"layers.{i}.weight": torch.zeros(4, 4) for i in range(6)}
    state.update({f"layers.{i}.old": torch.zeros(1) for i in range(6)})
    text = str(weightplan.explain(model, state))
    assert "layers.{0..5}.old has no model tensor of that name; the model declares it " \
        "ignorable" in text
    assert text.count("has no model tensor") == 1 and "problems: none" in text


def test_version_and_plain_help(capsys):
    try:
        main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    assert capsys.readouterr().out.strip() == f"weightplan {weightplan.__version__}"
    try:
        main(["--help"])
    except SystemExit:
        pass
    out = capsys.readouterr().out
    assert "``" not in out and ":class:" not in out and "weightplan explain ORG/NAME" in out
