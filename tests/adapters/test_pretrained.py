"""``from_pretrained(BASE, adapter=...)`` (base on meta, adapter injected with peft, one
plan) and ``weightplan explain ADAPTER_DIR [--base BASE]``."""

from __future__ import annotations

import json
import math

import pytest
import torch

import weightplan
from weightplan.api.adapters import explain_with_adapter
from weightplan.bridge.hub import build_empty_model
from weightplan.cli import main
from weightplan.errors import AdapterError, ParallelError

from tests.adapters.builders import (
    MIXTRAL, PREFIX, QWEN2_MOE, per_expert_adapter, tiny_model, write_config,
)
from tests.adapters.test_experts import _check_math

peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixtral")
    tiny_model("mixtral").save_pretrained(root / "base")
    per_expert_adapter(str(root / "v4"), MIXTRAL)
    return root


def _without_prefix(model):
    return {k.removeprefix(PREFIX): v for k, v in model.state_dict().items()}


def test_base_and_adapter_like_peft(mixtral):
    oracle = peft.PeftModel.from_pretrained(tiny_model("mixtral"), str(mixtral / "v4"))
    model = weightplan.from_pretrained(mixtral / "base", adapter=mixtral / "v4")
    assert type(model).__name__ == "MixtralForCausalLM"
    theirs, ours = _without_prefix(oracle), model.state_dict()
    assert set(theirs) == set(ours)
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []
    ids = torch.arange(12)[None]
    assert torch.equal(oracle(ids).logits, model(ids).logits)


def test_one_plan_one_schedule(mixtral):
    model = build_empty_model(mixtral / "base").model
    plan = explain_with_adapter(model, mixtral / "base", mixtral / "v4")
    assert len(plan.checkpoint.files) == 2 and not plan.problems
    assert not plan.missing and not plan.unexpected
    assert plan.adapter.loaded_tensors == plan.adapter.file_tensors == 52
    assert len(plan.loaded_keys) == len(list(model.state_dict()))


def test_qwen2_moe_rslora_keeps_the_trained_scale(tmp_path):
    tiny_model("qwen2_moe").save_pretrained(tmp_path / "base")
    tensors = per_expert_adapter(str(tmp_path / "v4"), QWEN2_MOE, rslora=True, r=4, alpha=4)
    model = weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "v4")
    _check_math(model, tensors, QWEN2_MOE, 4 / math.sqrt(4))
    base = tiny_model("qwen2_moe").state_dict()
    experts = model.model.layers[0].mlp.experts.base_layer.base_layer
    assert torch.equal(experts.gate_up_proj, base["model.layers.0.mlp.experts.gate_up_proj"])


def test_plain_modules_with_modules_to_save(tmp_path):
    tiny_model("llama").save_pretrained(tmp_path / "base")
    trained = peft.get_peft_model(tiny_model("llama", seed=3), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj", "down_proj"], modules_to_save=["lm_head"],
        init_lora_weights=False))
    trained.save_pretrained(tmp_path / "lora")
    oracle = peft.PeftModel.from_pretrained(tiny_model("llama"), str(tmp_path / "lora"))
    model = weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora")
    theirs, ours = _without_prefix(oracle), model.state_dict()
    assert set(theirs) == set(ours)
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []


def test_tp_with_an_adapter_is_refused(mixtral):
    with pytest.raises(ParallelError, match="adapter"):
        weightplan.from_pretrained(mixtral / "base", adapter=mixtral / "v4", tp="auto")


def test_cli_explains_adapter_with_its_base(mixtral, capsys):
    assert main(["explain", str(mixtral / "v4"), "--base", str(mixtral / "base")]) == 0
    out = capsys.readouterr().out
    assert "adapter: " in out and "loads 52 of the adapter's 52 tensors" in out
    assert "→ gate_up_proj" in out


def test_cli_merge_is_from_pretrained_merge(mixtral, capsys):
    assert main(["explain", str(mixtral / "v4"), "--base", str(mixtral / "base"), "--merge",
                 "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    model = build_empty_model(mixtral / "base").model
    api = explain_with_adapter(model, mixtral / "base", mixtral / "v4", merge=True)
    assert cli["adapter"] == json.loads(json.dumps(api.to_dict()["adapter"]))
    assert cli["adapter"]["merged"] == api.adapter.merged == 6  # q_proj, gate_up, down ×2
    assert main(["explain", str(mixtral / "v4"), "--base", str(mixtral / "base"),
                 "--merge"]) == 0
    out = capsys.readouterr().out
    assert "merged: s·B·A folded into 6 base weights" in out and "MergeLora(" in out
    assert main(["explain", str(mixtral / "v4"), "--base", str(mixtral / "base")]) == 0
    assert "MergeLora(" not in capsys.readouterr().out


def test_cli_base_from_the_config(tmp_path, capsys):
    tiny_model("mixtral").save_pretrained(tmp_path / "base")
    per_expert_adapter(str(tmp_path / "v4"), MIXTRAL)
    config = json.loads((tmp_path / "v4" / "adapter_config.json").read_text())
    write_config(str(tmp_path / "v4"), **{**config,
                                          "base_model_name_or_path": str(tmp_path / "base")})
    assert main(["explain", str(tmp_path / "v4"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["adapter"]["loaded_tensors"] == 52


def test_cli_without_a_base_says_what_to_do(mixtral, capsys):
    assert main(["explain", str(mixtral / "v4")]) == 5
    assert "--base" in capsys.readouterr().err


@pytest.mark.parametrize("convention", ["torch.device", "accelerate", "init_empty"])
def test_models_built_on_meta_every_convention(mixtral, convention):
    import accelerate
    from transformers import AutoModelForCausalLM

    from tests.adapters.builders import tiny_config

    build = {"torch.device": lambda: torch.device("meta"),
             "accelerate": accelerate.init_empty_weights,
             "init_empty": weightplan.init_empty}[convention]
    with build():
        model = AutoModelForCausalLM.from_config(tiny_config("mixtral"))
    explain_with_adapter(model, mixtral / "base", mixtral / "v4").execute()
    oracle = peft.PeftModel.from_pretrained(tiny_model("mixtral"), str(mixtral / "v4"))
    theirs, ours = _without_prefix(oracle), model.state_dict()
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []


def test_an_adapter_directory_loads_onto_its_configs_base(tmp_path):
    tiny_model("mixtral").save_pretrained(tmp_path / "base")
    per_expert_adapter(str(tmp_path / "v4"), MIXTRAL)
    config = json.loads((tmp_path / "v4" / "adapter_config.json").read_text())
    write_config(str(tmp_path / "v4"), **{**config,
                                          "base_model_name_or_path": str(tmp_path / "base")})
    model = weightplan.from_pretrained(tmp_path / "v4")
    oracle = peft.PeftModel.from_pretrained(tiny_model("mixtral"), str(tmp_path / "v4"))
    ids = torch.arange(12)[None]
    assert torch.equal(oracle(ids).logits, model(ids).logits)
    write_config(str(tmp_path / "v4"), **{**config, "base_model_name_or_path": None})
    with pytest.raises(AdapterError, match=r"adapter=ADAPTER_DIR"):
        weightplan.from_pretrained(tmp_path / "v4")


def test_adapter_stays_float32_on_a_bf16_base_as_peft_keeps_it(mixtral):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(mixtral / "base", dtype=torch.bfloat16)
    oracle = peft.PeftModel.from_pretrained(base, str(mixtral / "v4"))
    model = weightplan.from_pretrained(mixtral / "base", adapter=mixtral / "v4",
                                       dtype=torch.bfloat16)
    theirs, ours = _without_prefix(oracle), model.state_dict()
    assert {v.dtype for k, v in ours.items() if ".lora_" in k} == {torch.float32}
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []


def test_saving_a_model_with_an_unmerged_adapter_asks_which(mixtral, tmp_path):
    """``save(model, dir)`` of a base + adapter load wrote the base checkpoint with the
    adapter's 52 tensors mixed in under peft's file names: a directory that neither
    weightplan (52 unexpected keys) nor transformers loads as the adapted model. It is
    refused before anything is written, naming both ways out."""
    from weightplan.errors import SaveError

    model = weightplan.from_pretrained(mixtral / "base", adapter=mixtral / "v4")
    for call in (weightplan.save, weightplan.explain_save):
        with pytest.raises(SaveError, match=r"adapter 'default'.*adapter_name='default'"
                                            r".*merge=True"):
            call(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    weightplan.save(model, tmp_path / "adapter", adapter_name="default")  # the adapter alone
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    merged = weightplan.from_pretrained(mixtral / "base", adapter=mixtral / "v4", merge=True)
    weightplan.save(merged, tmp_path / "merged")  # the merged model: the base's layout
    assert not weightplan.explain(None, tmp_path / "merged").unexpected


def test_a_fused_adapter_file_is_not_said_to_be_converted_from_per_expert(mixtral, tmp_path):
    """The adapter section said 'layout: per-expert w1, w3 → gate_up_proj: lora_A
    concatenated…' for an adapter saved fused (peft's target_parameters), whose tensors
    load as they are: only a file with per-expert linears gets those lines."""
    model = weightplan.from_pretrained(mixtral / "base", adapter=mixtral / "v4")
    per_expert = explain_with_adapter(build_empty_model(mixtral / "base").model,
                                      mixtral / "base", mixtral / "v4")
    assert [c.target for c in per_expert.adapter.conversions] == ["gate_up_proj", "down_proj"]
    weightplan.save(model, tmp_path / "fused", adapter_name="default", layout="fused")
    plan = explain_with_adapter(build_empty_model(mixtral / "base").model, mixtral / "base",
                                tmp_path / "fused")
    assert not plan.problems and plan.adapter.loaded_tensors == plan.adapter.file_tensors
    assert plan.adapter.conversions == (), plan.adapter.conversions
    assert "per-expert" not in str(plan).split("\n\n")[0]


def test_saving_a_model_with_an_unmerged_embedding_adapter_is_refused_too(tmp_path):
    """An adapter on ``embed_tokens`` alone holds ``lora_embedding_A`` / ``_B``, no
    ``lora_A``: ``save(model, dir)`` wasn't refused and wrote the base shards with its
    ``lora_embedding_A`` / ``_B`` tensors mixed in, as it did for ``lora_A`` adapters."""
    from weightplan.errors import SaveError

    tiny_model("llama").save_pretrained(tmp_path / "base")
    peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["embed_tokens"], init_lora_weights=False)
    ).save_pretrained(str(tmp_path / "lora"), save_embedding_layers=False)
    model = weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora")
    assert any(".lora_embedding_A." in n for n, _ in model.named_parameters())
    with pytest.raises(SaveError, match=r"adapter 'default'.*adapter_name='default'"):
        weightplan.save(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("merge", [False, True])
@pytest.mark.parametrize("sharded", [False, True])
def test_base_files_left_unread_are_noted_with_an_adapter(tmp_path, sharded, merge):
    """A ``.safetensors`` file of the base directory its checkpoint doesn't read (beside
    ``model.safetensors``; a shard the index doesn't name) is noted as ``explain(model,
    base)`` notes it (was: not a word with an adapter, the base reopened as a list of files)."""
    from safetensors.torch import save_file

    tiny_model("llama").save_pretrained(tmp_path / "base",
                                        max_shard_size="20KB" if sharded else "1GB")
    assert (tmp_path / "base" / "model.safetensors").exists() is not sharded
    save_file({"stray": torch.ones(2)}, str(tmp_path / "base" / "stray.safetensors"))
    (tmp_path / "lora").mkdir()
    save_file({f"{PREFIX}model.layers.{i}.self_attn.q_proj.lora_{f}.weight": torch.ones(shape)
               for i in range(2) for f, shape in (("A", (2, 16)), ("B", (16, 2)))},
              str(tmp_path / "lora" / "adapter_model.safetensors"))
    write_config(str(tmp_path / "lora"), target_modules=["q_proj"])
    alone = weightplan.explain(build_empty_model(tmp_path / "base").model, tmp_path / "base")
    [why] = [n.message.partition(" but not read: ")[2] for n in alone.notes
             if n.key == "stray.safetensors"]
    assert ("is read alone" in why) is not sharded and ("index doesn't name" in why) is sharded
    plan = explain_with_adapter(build_empty_model(tmp_path / "base").model, tmp_path / "base",
                                tmp_path / "lora", merge=merge)
    notes = [n for n in plan.notes if "stray.safetensors" in n.key]
    assert [n.key for n in notes] == [str(tmp_path / "base" / "stray.safetensors")]
    assert notes[0].message.endswith(f" but not read: {why}")
    assert "stray.safetensors" in str(plan) and not plan.problems


@pytest.mark.parametrize("merge", [False, True])
def test_a_modules_to_save_copy_takes_the_asked_dtype_as_peft_casts_it(tmp_path, merge):
    """from_pretrained(dtype=bf16) of a float32 checkpoint with a modules_to_save lm_head:
    peft's copy is the base module's (bf16), its LoRA factors float32; the copy was kept
    float32 and the forward raised 'expected m1 and m2 to have the same dtype'."""
    import copy

    from transformers import AutoModelForCausalLM

    tiny_model("llama").save_pretrained(tmp_path / "base")
    trained = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj"], modules_to_save=["lm_head"],
        init_lora_weights=False))
    trained.save_pretrained(tmp_path / "lora")
    oracle = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(
        tmp_path / "base", dtype=torch.bfloat16), tmp_path / "lora")
    if merge:
        oracle = copy.deepcopy(oracle).merge_and_unload()
    model = weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora",
                                       dtype=torch.bfloat16, merge=merge)
    theirs, ours = _without_prefix(oracle), model.state_dict()
    assert {k: v.dtype for k, v in ours.items()} == {k: v.dtype for k, v in theirs.items()}
    ids = torch.arange(12)[None]
    if not merge:  # (merged: rounded once from float32 here, twice in peft)
        assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []
        assert torch.equal(oracle(ids).logits, model(ids).logits)
    else:
        assert torch.allclose(oracle(ids).logits, model(ids).logits, atol=0.05)


def test_cli_base_and_adapter_swapped_says_so(mixtral, capsys):
    """'weightplan explain BASE --base ADAPTER' said 'no config.json to build a model
    from; pass --model-type' about the adapter directory."""
    assert main(["explain", str(mixtral / "base"), "--base", str(mixtral / "v4")]) == 5
    err = capsys.readouterr().err
    assert "is an adapter directory" in err and "weightplan explain" in err
    assert "--model-type" not in err
