"""Every header counts in words, singular or plural as the number says: a load's, an adapter
plan's (named by its base and its adapter, not "2 files (2 file(s)"), a save's and a
conversion's, the write report's, the plan's repr and ``recover``'s answer."""

import re

import pytest
import torch

import weightplan
from weightplan.cli import main
from tests.conftest import module_with, write_checkpoint

_ODD = re.compile(r"\(s\)|\b1 (files|tensors|problems)\b|\b(?!1\b)\d+ (file|tensor|problem)\b")


def _grammatical(text: str) -> None:
    assert not _ODD.search(text), _ODD.search(text)


@pytest.fixture
def one(tmp_path):
    """A one-file, one-tensor checkpoint and its model."""
    write_checkpoint(tmp_path / "one", {"w": torch.ones(2, 2)})
    return tmp_path / "one", module_with({"w": ((2, 2), torch.float32)})


def test_a_one_file_one_tensor_load_and_save_say_so(one, tmp_path):
    ckpt, model = one
    plan = weightplan.explain(model, ckpt)
    head = str(plan).splitlines()[0]
    assert f"{ckpt} (1 file, 1 tensor, 16 B) → Module (1 tensor, 16 B" in head, head
    assert re.search(r": 1 tensor, peak \d+ B, 0 problems>$", repr(plan)), repr(plan)
    plan.execute(progress=False)
    save = weightplan.explain_save(model, tmp_path / "out")
    head = str(save).splitlines()[0]
    assert "(1 tensor) →" in head and "(1 file, 1 tensor, 16 B)" in head, head
    _grammatical(str(save) + repr(save))
    report = str(save.execute(progress=False))
    assert report.startswith("wrote 1 tensor (16 B) to ") and " in 1 file in " in report, report


def test_a_list_of_files_is_named_by_its_first_and_how_many_more(tmp_path):
    a = write_checkpoint(tmp_path / "a", {"x": torch.ones(2)}) / "model.safetensors"
    b = write_checkpoint(tmp_path / "b", {"y": torch.ones(2)}) / "model.safetensors"
    model = module_with({"x": ((2,), torch.float32), "y": ((2,), torch.float32)})
    head = str(weightplan.explain(model, [a, b])).splitlines()[0]
    assert head.startswith(f"weightplan plan: {a} + 1 more (2 files, 2 tensors, "), head


def test_an_adapter_plan_names_its_base_and_its_adapter(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1))
    llama.save_pretrained(tmp_path / "base")
    peft.get_peft_model(llama, peft.LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(
        tmp_path / "lora")
    for merge in ([], ["--merge"]):
        assert main(["explain", str(tmp_path / "lora"), "--base", str(tmp_path / "base"),
                     *merge]) == 0
        out = capsys.readouterr().out
        head = out.splitlines()[0]
        assert head.startswith(f"weightplan plan: {tmp_path / 'base'} + adapter "
                               f"{tmp_path / 'lora'} (2 files, "), head
        _grammatical(out)


def test_recover_counts_in_words(tmp_path):
    from weightplan.executor.commit import recover

    from weightplan.executor.journal import PARTIAL

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / f".model.safetensors.x{PARTIAL}").write_bytes(b"")
    assert recover(tmp_path / "d") == f"{tmp_path / 'd'}: no interrupted save; removed 1 " \
                                      "orphaned temporary file"
