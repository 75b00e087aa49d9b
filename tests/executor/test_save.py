"""Saving: exact round trips, sharding, atomicity, bad targets, derived inverses."""

import errno
import hashlib
import json
import os

import pytest
import torch
from safetensors.torch import load_file

import weightplan
from weightplan import PrefixChange, WeightConverter, WeightRenaming
from weightplan.errors import NotInvertibleError, SaveError
from weightplan.ops import Chunk, Transpose

from tests.conftest import module_with, moe_checkpoint, moe_model, write_checkpoint


def read_dir(directory):
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(directory, name)))
    return out


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def digest(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_save_after_load_gives_back_the_checkpoint(tmp_path, dtype):
    ckpt = moe_checkpoint(dtype=dtype)
    src = write_checkpoint(tmp_path / "src", ckpt, shards=2)
    before = digest(src)
    model = moe_model(dtype=torch.float32)  # load casts; save casts back exactly
    weightplan.load(model, src, mapping="mixtral")
    report = weightplan.save(model, tmp_path / "out", max_shard_size=1000)
    back = read_dir(tmp_path / "out")
    assert set(back) == set(ckpt)
    assert all(same_bits(back[k], ckpt[k]) for k in ckpt)
    assert digest(src) == before
    assert report.tensors_written == len(ckpt) and len(report.files) > 2


def test_sharded_output_has_a_loadable_index(tmp_path):
    ckpt = moe_checkpoint()
    model = moe_model()
    weightplan.load(model, ckpt, mapping="mixtral")
    weightplan.save(model, tmp_path / "out", max_shard_size=1000)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(ckpt)
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in ckpt.values())
    for key, name in index["weight_map"].items():
        assert key in load_file(str(tmp_path / "out" / name))
    reloaded = moe_model()
    weightplan.load(reloaded, tmp_path / "out", mapping="mixtral")
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(),
                                                  model.state_dict().values(), strict=True))


def test_process_group_is_checked_before_anything_is_written(tmp_path):
    """``process_group=`` is a ProcessGroup or a 1-D DeviceMesh, refused by name otherwise
    (the multi-rank saves: tests/parallel/test_dp_save.py)."""
    from weightplan.errors import ArgumentError

    model = moe_model()
    weightplan.load(model, moe_checkpoint(), mapping="mixtral")
    with pytest.raises(ArgumentError, match="process_group must be"):
        weightplan.save(model, tmp_path / "out", process_group="world")
    assert not (tmp_path / "out").exists()
    plan = weightplan.explain_save(model, tmp_path / "out")  # (the plan's execute: the same)
    with pytest.raises(ArgumentError, match="process_group must be"):
        plan.execute(process_group="world")
    assert not (tmp_path / "out").exists()


def test_a_model_never_loaded_saves_through_the_inverse_mapping(tmp_path):
    model = moe_model(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    plan = weightplan.explain_save(model, tmp_path / "out", mapping="mixtral")
    assert plan.inversion.value == "mapping"
    plan.execute()
    back = read_dir(tmp_path / "out")
    assert "model.layers.1.block_sparse_moe.experts.3.w2.weight" in back
    assert "model.layers.0.LayerNorm.weight" in back  # legacy renames are not reversed
    fresh = moe_model()
    weightplan.load(fresh, tmp_path / "out", mapping="mixtral")
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(),
                                                  model.state_dict().values(), strict=True))


def test_prefix_change_is_refused_without_a_record(tmp_path):
    model = module_with({"model.w": torch.ones(2)}, device="cpu")
    with pytest.raises(NotInvertibleError, match="add prefix model"):
        weightplan.explain_save(model, tmp_path / "o", mapping=[PrefixChange(prefix_to_add="model")])


def test_record_replays_which_keys_had_the_prefix(tmp_path):
    ckpt = {"layers.0.w": torch.randn(2), "model.layers.1.w": torch.randn(2)}
    model = module_with({"model.layers.0.w": ((2,), torch.float32),
                         "model.layers.1.w": ((2,), torch.float32)})
    weightplan.load(model, ckpt, mapping=[PrefixChange(prefix_to_add="model")])
    weightplan.save(model, tmp_path / "o")
    back = read_dir(tmp_path / "o")
    assert set(back) == set(ckpt) and all(torch.equal(back[k], ckpt[k]) for k in ckpt)


def test_mutations_are_saved_under_the_original_key(tmp_path):
    ckpt = moe_checkpoint()
    model = moe_model()
    weightplan.load(model, ckpt, mapping="mixtral")
    with torch.no_grad():
        model.model.layers.get_submodule("1").mlp.experts.gate_up_proj[2, 7, 3] = 1234.5
    weightplan.save(model, tmp_path / "o")
    back = read_dir(tmp_path / "o")
    # row 7 of the fused gate|up block (6 rows each) is row 1 of expert 2's w3
    assert back["model.layers.1.block_sparse_moe.experts.2.w3.weight"][1, 3] == 1234.5
    changed = [k for k in ckpt if not torch.equal(back[k], ckpt[k])]
    assert changed == ["model.layers.1.block_sparse_moe.experts.2.w3.weight"]


def test_occupied_directory_needs_overwrite_and_keeps_other_files(tmp_path):
    ckpt = moe_checkpoint()
    model = moe_model()
    weightplan.load(model, ckpt, mapping="mixtral")
    out = tmp_path / "o"
    weightplan.save(model, out, max_shard_size=1000)
    (out / "config.json").write_text("{}")
    with pytest.raises(SaveError, match="overwrite=True"):
        weightplan.save(model, out)
    weightplan.save(model, out, overwrite=True)  # one file now: the old shards go
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]


def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    model = moe_model()
    weightplan.load(model, moe_checkpoint(), mapping="mixtral")
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    real = os.pwrite
    calls = {"n": 0}

    def failing(fd, data, offset):
        calls["n"] += 1
        if calls["n"] > 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", failing)
    with pytest.raises(SaveError, match="No space left"):
        weightplan.save(model, out, max_shard_size=1000, threads=0)
    assert os.listdir(out) == ["keep.txt"]


def test_bad_targets_fail_before_writing(tmp_path, monkeypatch):
    model = moe_model()
    weightplan.load(model, moe_checkpoint(), mapping="mixtral")
    (tmp_path / "file").write_text("x")
    with pytest.raises(SaveError, match="not a directory"):
        weightplan.explain_save(model, tmp_path / "file")
    import shutil
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 10))
    with pytest.raises(SaveError, match="only 10 are free"):
        weightplan.explain_save(model, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_meta_tensors_cannot_be_saved(tmp_path):
    with pytest.raises(SaveError, match="meta"):
        weightplan.explain_save(moe_model(), tmp_path / "o", mapping="mixtral")


def test_save_plan_explains_itself(tmp_path):
    model = moe_model()
    weightplan.load(model, moe_checkpoint(), mapping="mixtral")
    plan = weightplan.explain_save(model, tmp_path / "o")
    text = str(plan)
    assert "exact inverse of the recorded load" in text
    assert "→ model.layers.{0,1}.block_sparse_moe.experts.{0..3}.w1.weight" in text
    assert plan.to_dict()["inversion"] == "record" and not (tmp_path / "o").exists()


def test_uneven_chunk_and_transpose_round_trip(tmp_path):
    ckpt = {"attn.qkv.weight": torch.randn(16, 8), "fc": torch.randn(5, 7)}
    model = module_with({"attn.q.weight": ((8, 8), torch.float32),
                         "attn.k.weight": ((4, 8), torch.float32),
                         "attn.v.weight": ((4, 8), torch.float32),
                         "proj": ((7, 5), torch.float32)})
    mapping = [WeightConverter("qkv.weight", ["q.weight", "k.weight", "v.weight"], [Chunk(0)]),
               WeightConverter("^fc$", "proj", [Transpose(0, 1)])]
    weightplan.load(model, ckpt, mapping=mapping)
    weightplan.save(model, tmp_path / "o")
    back = read_dir(tmp_path / "o")
    assert set(back) == set(ckpt) and all(torch.equal(back[k], ckpt[k]) for k in ckpt)


def test_renaming_with_groups_derived_inverse(tmp_path):
    model = module_with({"blocks.0.attention.w": torch.ones(2), "blocks.1.attention.w": torch.zeros(2)},
                        device="cpu")
    weightplan.save(model, tmp_path / "o",
                    mapping=[WeightRenaming(r"layers\.(\d+)\.attn", r"blocks.\1.attention")])
    assert set(read_dir(tmp_path / "o")) == {"layers.0.attn.w", "layers.1.attn.w"}


def test_each_direction_is_its_own_plan_type(tmp_path):
    from weightplan.planner.pipelines.plan import Direction, LoadPlanData
    from weightplan.planner.tensors.ir.destination import DestKind
    from weightplan.planner.pipelines.write_plan import WritePlanData

    model = moe_model()
    load = weightplan.explain(model, moe_checkpoint(), mapping="mixtral")
    assert load.direction is Direction.LOAD and isinstance(load, LoadPlanData)
    load.execute()
    save = weightplan.explain_save(model, tmp_path / "o")
    assert save.direction is Direction.SAVE and isinstance(save, WritePlanData)
    assert not isinstance(save, LoadPlanData)  # no model side, no stand-ins for one
    report = save.execute()
    convert = weightplan.explain_convert(tmp_path / "o", tmp_path / "c", mapping="mixtral")
    assert convert.direction is Direction.CONVERT and convert.inversion.value == "forward"
    kinds = {d.kind for p in (load, save, convert) for s in p.schedule.steps for d in s.destinations}
    assert kinds == {DestKind.ALLOCATE, DestKind.FILE} and report.files


def test_a_second_load_replaces_what_it_overwrote(tmp_path):
    from weightplan.planner.write.record import get_record

    ckpt = moe_checkpoint()
    model = moe_model()
    weightplan.load(model, ckpt, mapping="mixtral")
    first = get_record(model)
    newer = {k: v + 1 for k, v in ckpt.items() if ".layers.1." in k}
    weightplan.load(model, newer, mapping="mixtral")
    record = get_record(model)
    assert len(record.conversions) == len(first.conversions)  # replaced, not appended
    assert set(record.order) == set(ckpt) and record.order[:len(newer)] == tuple(
        k for k in record.order if k in newer)
    weightplan.save(model, tmp_path / "o")
    back = read_dir(tmp_path / "o")
    assert set(back) == set(ckpt)
    assert all(torch.equal(back[k], newer.get(k, ckpt[k])) for k in ckpt)


@pytest.mark.parametrize("loaded", [True, False])
def test_a_save_inspects_the_model_once_and_builds_once(tmp_path, monkeypatch, loaded):
    """Also with ``quantize="fp8"``: the outputs to quantize are chosen from the built
    conversions, which are then quantized in place, not built again."""
    import weightplan.planner.pipelines.save as save

    calls = {"inspect": 0, "build": 0}

    def counted(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return call

    model = moe_model(device="cpu")
    if loaded:
        weightplan.load(model, moe_checkpoint(), mapping="mixtral")
    monkeypatch.setattr(save, "inspect_model", counted("inspect", save.inspect_model))
    monkeypatch.setattr(save, "build_conversions", counted("build", save.build_conversions))
    plan = weightplan.explain_save(model, tmp_path / "o", quantize="fp8",
                                   mapping=None if loaded else "mixtral")
    assert calls == {"inspect": 1, "build": 1}
    assert any(t.key.endswith("w1.weight_scale_inv") for c in plan.conversions for t in c.targets)
