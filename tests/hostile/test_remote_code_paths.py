"""No path through weightplan imports a checkpoint's shipped .py files, whatever it is
given: a model whose config.json has ``auto_map`` (a ``model_type`` transformers has, so
it builds transformers' classes where transformers does), loaded by ``from_pretrained`` with
``trust_remote_code`` unset, False or True and each kind of ``model_class``, with an adapter
beside it or naming it as its base, and by ``weightplan explain`` / ``convert``; every
prompt answered "y". The shipped files write a marker and raise if ever imported."""

from __future__ import annotations

import io
import json
import sys

import pytest
import torch

import weightplan
from weightplan.cli import main
from weightplan.errors import WeightplanError

T = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

MODULES = ("configuration_shipped", "modeling_shipped")
AUTO_MAP = {"AutoConfig": "configuration_shipped.ShippedConfig",
            "AutoModel": "modeling_shipped.ShippedModel",
            "AutoModelForCausalLM": "modeling_shipped.ShippedForCausalLM",
            "AutoModelForSequenceClassification": "modeling_shipped.ShippedForSeq"}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """A tiny Llama saved by transformers, its config's auto_map naming shipped modules;
    ``both``: the same with a LoRA adapter saved beside it; ``lora``: an adapter alone
    naming ``model`` as its base."""
    root = tmp_path_factory.mktemp("shipped")
    marker = root / "imported"
    cfg = T.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(cfg)
    for name in ("model", "both"):
        model.save_pretrained(root / name)
        config = json.loads((root / name / "config.json").read_text())
        (root / name / "config.json").write_text(json.dumps({**config, "auto_map": AUTO_MAP}))
        for module in MODULES:
            (root / name / f"{module}.py").write_text(
                f"open({str(marker)!r}, 'a').write({module!r})\nraise SystemExit('imported')\n")
    trained = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"],
                                                         init_lora_weights=False))
    trained.save_pretrained(root / "both")
    trained.save_pretrained(root / "lora")
    config = json.loads((root / "lora" / "adapter_config.json").read_text())
    (root / "lora" / "adapter_config.json").write_text(json.dumps(
        {**config, "base_model_name_or_path": str(root / "model")}))
    return root, marker


def _never_imported(marker) -> None:
    assert not marker.exists(), "code shipped with the checkpoint ran"
    assert not [m for m in sys.modules if m.split(".")[-1] in MODULES]


def _attempt(call) -> str:
    """'loaded' or the weightplan error's class name (any other exception fails)."""
    try:
        call()
    except WeightplanError as e:
        return type(e).__name__
    return "loaded"


@pytest.mark.parametrize("trust", [None, False, True])
@pytest.mark.parametrize("model_class", [None, "AutoModelForCausalLM", "AutoModel",
                                         "AutoModelForSequenceClassification",
                                         "LlamaForCausalLM"])
@pytest.mark.parametrize("where", ["model", "both", "lora", "adapter="])
def test_from_pretrained_never_imports_shipped_code(shipped, trust, model_class, where,
                                                    monkeypatch):
    """Loaded with transformers' classes, or refused (ModelBuildError) where transformers
    would import the shipped classes: under trust_remote_code=True for AutoConfig's entry
    (any auto class) or the auto class's own."""
    root, marker = shipped
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 8))
    keywords = {} if trust is None else {"trust_remote_code": trust}
    if model_class is not None:
        keywords["model_class"] = getattr(T, model_class)
    if where == "adapter=":
        keywords["adapter"] = root / "lora"
    path = root / ("model" if where == "adapter=" else where)
    outcome = _attempt(lambda: weightplan.from_pretrained(path, **keywords))
    _never_imported(marker)
    imports = trust is True and model_class != "LlamaForCausalLM"
    assert outcome == ("ModelBuildError" if imports else "loaded"), outcome


@pytest.mark.parametrize("args", [["explain", "{root}/model"], ["explain", "{root}/both"],
                                  ["explain", "{root}/lora"],
                                  ["explain", "{root}/lora", "--base", "{root}/model"],
                                  ["explain", "{root}/both", "--merge"],
                                  ["convert", "{root}/model", "{out}", "--dry-run"],
                                  ["convert", "{root}/both", "{out}"]])
def test_the_command_line_never_imports_shipped_code(shipped, args, tmp_path, monkeypatch,
                                                     capsys):
    root, marker = shipped
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 8))
    code = main([a.format(root=root, out=tmp_path / "out") for a in args])
    _never_imported(marker)
    assert code == 0, capsys.readouterr().err
    assert "never runs code" not in capsys.readouterr().err


def test_the_keys_alone_never_import_shipped_code(shipped):
    root, marker = shipped
    for path in ("model", "both"):
        assert weightplan.explain(None, root / path).checkpoint.files
    _never_imported(marker)
