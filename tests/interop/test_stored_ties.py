"""A checkpoint that stores both names of a tie the model declares
(``tie_word_embeddings=True`` and an ``lm_head.weight`` beside ``model.embed_tokens.weight``)
loads as transformers loads it: both tensors read; equal values tied again (one tensor,
two names), different ones left untied with a warning naming both keys, and the model's
tie bookkeeping (``all_tied_weights_keys``) updated so a save writes both. Under every build
convention; the plan says so and counts the second tensor; under tensor parallel the
second name is sharded as the first (the ranks compare shards: ``tests/parallel/
test_stored_ties_tp.py``); a name on the disk is compared from its offloaded file (see
``planner/pipelines/stored_ties.py``)."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
import transformers as T
from safetensors.torch import load_file, save_file

import weightplan
from weightplan.errors import ExecutionError
from weightplan.parallel import TensorParallel
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.model_info import ModelInfo, ModelTensor
from weightplan.planner.keys.routing import Group
from weightplan.planner.pipelines.load import explain_load
from weightplan.planner.pipelines.stored_ties import split_stored_ties

from tests.interop.matrix import BUILDS, IDS, TEXT, build

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
CFG = T.Qwen2Config(**TEXT, tie_word_embeddings=True)


def _checkpoint(directory, head):
    """A tied tiny Qwen2 saved by transformers, then ``lm_head.weight`` added: ``head`` of
    the embeddings (a copy) or other values."""
    torch.manual_seed(0)
    T.Qwen2ForCausalLM(CFG).save_pretrained(directory)
    tensors = load_file(str(directory / "model.safetensors"))
    assert HEAD not in tensors  # (transformers saves a tie once)
    tensors[HEAD] = head(tensors[EMBED]).contiguous()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


@pytest.fixture(scope="module", params=["different", "equal"])
def stored(request, tmp_path_factory):
    torch.manual_seed(1)
    other = torch.randn(CFG.vocab_size, CFG.hidden_size)
    head = (lambda e: other) if request.param == "different" else (lambda e: e.clone())
    directory = _checkpoint(tmp_path_factory.mktemp(f"ties-{request.param}"), head)
    reference = T.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    return request.param, directory, reference


def _logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _like_transformers(model, kind, reference):
    expected, got = reference.state_dict(), model.state_dict()
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    assert torch.equal(_logits(model), _logits(reference))
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied == (kind == "equal")
    assert tied == (reference.lm_head.weight is reference.model.embed_tokens.weight)
    assert model.all_tied_weights_keys == reference.all_tied_weights_keys


def _warned(caplog, kind):
    said = [r.getMessage() for r in caplog.records if r.name == "weightplan"
            and r.levelno == logging.WARNING and "tie_word_embeddings=False" in r.getMessage()]
    if kind == "equal":
        assert not said
    else:
        assert len(said) == 1 and EMBED in said[0] and HEAD in said[0], said


def test_from_pretrained_gives_what_transformers_gives(stored, caplog):
    kind, directory, reference = stored
    with caplog.at_level(logging.WARNING, logger="weightplan"):
        model = weightplan.from_pretrained(directory, dtype=torch.float32).eval()
    _warned(caplog, kind)
    _like_transformers(model, kind, reference)


@pytest.mark.parametrize("convention", BUILDS)
def test_every_build_convention_loads_the_same(stored, convention, caplog):
    kind, directory, reference = stored
    model = build(T.Qwen2ForCausalLM, CFG, convention)
    plan = weightplan.explain(model, directory)
    assert not plan.problems, str(plan)
    said = [n for n in plan.to_dict()["notes"] if HEAD in str(n) and EMBED in str(n)]
    assert any("both" in str(n) and "tie_word_embeddings=False" in str(n) for n in said), said
    assert "tie_word_embeddings=False" in str(plan)
    heads = [d for s in plan.schedule.steps for d in s.destinations if d.key == HEAD]
    assert len(heads) == 1 and heads[0].written and heads[0].aliases == (HEAD,)
    with caplog.at_level(logging.WARNING, logger="weightplan"):
        plan.execute(strict=True)
    _warned(caplog, kind)
    _like_transformers(model, kind, reference)


def test_the_plan_counts_the_second_tensor(stored, tmp_path):
    _, directory, _ = stored
    tensors = load_file(str(directory / "model.safetensors"))
    del tensors[HEAD]  # (as transformers saves a tie: once)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(directory / "config.json", tmp_path / "config.json")
    tied = tmp_path
    once = weightplan.explain(build(T.Qwen2ForCausalLM, CFG, "meta"), tied)
    both = weightplan.explain(build(T.Qwen2ForCausalLM, CFG, "meta"), directory)
    head = CFG.vocab_size * CFG.hidden_size * 4
    assert both.read_bytes == once.read_bytes + head
    assert both.peak_bytes >= once.peak_bytes + head


def test_save_then_transformers_reload(stored, tmp_path):
    kind, directory, reference = stored
    model = weightplan.from_pretrained(directory, dtype=torch.float32)
    weightplan.save(model, tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert HEAD in saved  # different: both; equal: the checkpoint back (save(load(x)) == x)
    assert torch.equal(saved[HEAD], load_file(str(directory / "model.safetensors"))[HEAD])
    back = T.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    _like_transformers(back, kind, reference)
    again = weightplan.from_pretrained(tmp_path, dtype=torch.float32).eval()
    _like_transformers(again, kind, reference)


def test_a_model_built_with_real_tensors_gets_the_same(stored):
    kind, directory, reference = stored
    torch.manual_seed(3)
    model = T.Qwen2ForCausalLM(CFG).eval()  # tied: one real tensor, two names
    assert model.lm_head.weight is model.model.embed_tokens.weight
    weightplan.explain(model, directory).execute(strict=True)
    _like_transformers(model, kind, reference)


def test_tensor_parallel_shards_the_second_name_as_the_first(stored):
    _, directory, _ = stored
    model = build(T.Qwen2ForCausalLM, CFG, "meta")
    plan = explain_load(model, directory, tp=TensorParallel(world_size=2, rank=1))
    shards = {d.key: d.shard for s in plan.schedule.steps for d in s.destinations
              if d.key in (EMBED, HEAD)}
    assert shards[HEAD] is not None and shards[HEAD] == shards[EMBED], shards
    assert shards[HEAD].placement.is_dtensor and shards[HEAD].rank == 1


SPLIT_MAPS = {"embedding on the disk": {"model.embed_tokens": "disk", "model.layers": "cpu",
                                        "model.norm": "cpu", "model.rotary_emb": "cpu",
                                        "lm_head": "cpu"},
              "head on the disk": {"model": "cpu", "lm_head": "disk"}}


@pytest.mark.parametrize("where", SPLIT_MAPS)
def test_one_name_on_the_disk_is_compared_from_its_file(stored, where, tmp_path, caplog):
    """Equal: left two tensors (on two devices, as a plain load leaves them), no warning;
    different: the plain load's warning. Either way the logits are transformers', and a
    save gives the checkpoint back."""
    kind, directory, reference = stored
    with caplog.at_level(logging.WARNING, logger="weightplan"):
        model = weightplan.from_pretrained(directory, dtype=torch.float32,
                                           device_map=SPLIT_MAPS[where],
                                           offload_folder=str(tmp_path / "off")).eval()
    _warned(caplog, kind)
    assert torch.equal(_logits(model), _logits(reference))
    weightplan.save(model, tmp_path / "saved")
    saved, stored_tensors = (load_file(str(d / "model.safetensors"))
                             for d in (tmp_path / "saved", directory))
    assert saved.keys() == stored_tensors.keys()
    assert all(torch.equal(saved[k], v) for k, v in stored_tensors.items())


def test_both_names_on_the_disk(stored, tmp_path, caplog):
    """Equal: tied again (one tensor on meta, read back from the disk by its hooks);
    different: an error naming both keys, as they can't stay two tensors there."""
    kind, directory, reference = stored
    load = lambda: weightplan.from_pretrained(directory, dtype=torch.float32,  # noqa: E731
                                              device_map={"": "disk"},
                                              offload_folder=str(tmp_path / "off")).eval()
    if kind == "different":
        with pytest.raises(ExecutionError, match=f"(?s){HEAD}.*{EMBED}.*disk.*"
                                                 "tie_word_embeddings=False"):
            load()
        return
    with caplog.at_level(logging.WARNING, logger="weightplan"):
        model = load()
    _warned(caplog, kind)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(_logits(model), _logits(reference))


def test_the_split_sees_names_a_converter_pattern_writes():
    """A tied name written by a ``*`` output pattern counts as stored, as a literal one."""
    spec = TensorSpec((4,), torch.float32)
    both = ModelTensor("a.0.w", spec, ("a.0.w", "b.w"), False, True, (1,), True)
    info = ModelInfo({"a.0.w": both, "b.w": both}, tied_names=("a.0.w", "b.w"))
    once = [Group(None, (), (), ("a.*.w",))]
    assert split_stored_ties(info, once) is info  # (one name written: stays tied)
    split = split_stored_ties(info, once + [Group(None, (), (), ("b.w",))])
    assert split.stored_ties == (("a.0.w", "b.w"),)
    assert split.get("b.w").aliases == ("b.w",) and split.get("b.w").allocates
    assert split.get("a.0.w").aliases == ("a.0.w",)


class _SharedByHand(torch.nn.Module):
    """Two modules sharing one weight by construction: no tie declared (no config)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)
        self.b.weight = self.a.weight


def test_a_tensor_shared_without_a_declared_tie_stays_one(tmp_path):
    """transformers compares only the ties the model declares (``all_tied_weights_keys``);
    a tensor the module shares by construction stays one tensor, read once from its first
    name, as before ties stored apart were split (it was split, warned about a
    ``tie_word_embeddings`` the module hasn't, and left two tensors)."""
    torch.manual_seed(0)
    first = torch.randn(4, 4)
    save_file({"a.weight": first, "b.weight": torch.randn(4, 4)},
              str(tmp_path / "model.safetensors"))
    with weightplan.init_empty():
        model = _SharedByHand()
    plan = weightplan.explain(model, tmp_path)
    assert "tie_word_embeddings" not in str(plan)
    plan.execute()
    assert model.a.weight is model.b.weight and torch.equal(model.a.weight, first)


@pytest.mark.parametrize("stored_dtype, dtype", [(torch.bfloat16, torch.float32),
                                                 (torch.float32, torch.bfloat16)])
def test_a_name_on_the_disk_is_compared_in_the_dtype_the_model_holds(stored_dtype, dtype,
                                                                      tmp_path, caplog):
    """An offloaded tensor referenced in place keeps the checkpoint's dtype in its file
    (accelerate's loader casts it to the model's): equal values stored in bfloat16 and
    loaded as float32 (or back) are equal, not a warning about different values."""
    torch.manual_seed(0)
    T.Qwen2ForCausalLM(CFG).to(stored_dtype).save_pretrained(tmp_path / "ckpt")
    tensors = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    tensors[HEAD] = tensors[EMBED].clone()
    save_file(tensors, str(tmp_path / "ckpt" / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING, logger="weightplan"):
        model = weightplan.from_pretrained(tmp_path / "ckpt", dtype=dtype,
                                           device_map=SPLIT_MAPS["embedding on the disk"],
                                           offload_folder=str(tmp_path / "off"))
    _warned(caplog, "equal")
    assert model.lm_head.weight.dtype == dtype
