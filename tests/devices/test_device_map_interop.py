"""``device_map="auto"`` end to end: dry runs for GPUs this machine lacks (checked against
accelerate's ``infer_auto_device_map``), disk offload that runs (logits equal to
transformers' own offloaded load), the keywords, the CLI."""

import json
import os

import pytest
import torch
from accelerate import infer_auto_device_map
from accelerate.utils import get_balanced_memory

import weightplan
from weightplan.cli import main
from weightplan.errors import ArgumentError, ParallelError, PlanError
from weightplan.units import parse_bytes

from tests.interop.matrix import FAMILIES, output, pretrained

KIB = 1024


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family → (class, config, inputs, checkpoint directory)."""
    out = {}
    for family in ("llama", "mixtral", "gemma2"):
        cls, cfg, inputs = FAMILIES[family]()
        words = {k: v for k, v in cfg.to_dict().items() if k != "layer_types"}
        cfg = type(cfg)(**{**words, "num_hidden_layers": 6})
        directory = tmp_path_factory.mktemp(family)
        torch.manual_seed(0)
        cls(cfg).save_pretrained(directory)
        out[family] = cls, cfg, inputs, directory
    return out


def empty(cls, cfg):
    with weightplan.init_empty():
        return cls(cfg).eval()


def device_weights(model, device_map) -> dict[str, int]:
    """Bytes per device of a map (each tensor once, by its longest mapped prefix)."""
    per: dict[str, int] = {}
    seen = set()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        prefix = max((p for p in device_map if not p or name == p or name.startswith(p + ".")),
                     key=len)
        device = str(device_map[prefix])
        per[device] = per.get(device, 0) + t.numel() * t.element_size()
    return per


def accelerate_words(max_memory):
    return {int(k.split(":")[1]) if k.startswith("cuda") else k: parse_bytes(v)
            for k, v in max_memory.items()}


@pytest.mark.parametrize("family", ["llama", "mixtral", "gemma2"])
@pytest.mark.parametrize("gpu", ["40KiB", "90KiB", "400KiB"])
@pytest.mark.parametrize("strategy", ["auto", "sequential"])
def test_dry_run_stays_in_budget_where_accelerate_does(saved, family, gpu, strategy):
    cls, cfg, _, directory = saved[family]
    max_memory = {"cuda:0": gpu, "cuda:1": gpu, "cpu": "2GiB"}
    model = empty(cls, cfg)
    plan = weightplan.explain(model, directory, device_map=strategy, max_memory=max_memory)
    assert all(p.is_meta for p in model.parameters())  # nothing allocated
    ours = device_weights(model, plan.device_map)
    budgets = {k: parse_bytes(v) for k, v in max_memory.items()}
    for use in plan.options.placement.uses:  # peak (weights + staging) + room kept
        if use.budget is not None:
            assert use.peak + use.kept <= use.budget, use
    for device, nbytes in ours.items():
        assert device == "disk" or nbytes <= budgets[device]
        assert plan.device_peaks[device] >= nbytes
    words = accelerate_words(max_memory)
    no_split = model._no_split_modules
    if strategy == "auto":
        words = get_balanced_memory(model, max_memory=words, no_split_module_classes=no_split)
    theirs = device_weights(model, infer_auto_device_map(model, max_memory=dict(words),
                                                         no_split_module_classes=no_split))
    for device, nbytes in theirs.items():  # where accelerate stays in budget, so do we
        name = f"cuda:{device}" if isinstance(device, int) or device.isdigit() else device
        if name != "disk" and nbytes <= budgets[name]:
            assert ours.get(name, 0) <= budgets[name]
    # whole blocks: no map entry lies strictly inside a no-split module
    for name, module in model.named_modules():
        if type(module).__name__ in no_split:
            assert not any(k.startswith(name + ".") for k in plan.device_map), name


def test_ties_share_a_device(saved):
    cls, cfg, _, directory = saved["gemma2"]  # tie_word_embeddings=True
    model = empty(cls, cfg)
    plan = weightplan.explain(model, directory, device_map="sequential",
                              max_memory={"cuda:0": "20KiB", "cuda:1": "2MiB", "cpu": "2GiB"})
    placement = plan.options.placement
    assert placement.device_of("lm_head.weight") == placement.device_of(
        "model.embed_tokens.weight")


def test_the_plan_shows_the_table_and_the_map(saved):
    cls, cfg, _, directory = saved["llama"]
    plan = weightplan.explain(empty(cls, cfg), directory, device_map="auto",
                              max_memory={"cuda:0": "60KiB", "cuda:1": "60KiB", "cpu": "1GiB"})
    text = str(plan)
    assert "device_map='auto'" in text and "cuda:0 (absent)" in text and "device map:" in text
    assert "dry run: this machine has no cuda:0, cuda:1" in text
    # the devices' budgets judge the placement, not this machine's memory for the whole model
    assert "this machine has" not in text.replace("dry run: this machine has", "")
    data = plan.to_dict()
    assert data["device_map"] == plan.device_map and data["device_peaks"] == plan.device_peaks
    assert [row["device"] for row in data["devices"]["table"]] == ["cuda:0", "cuda:1", "cpu",
                                                                    "disk"]
    json.dumps(data)
    with pytest.raises(PlanError, match="dry run"):  # nothing runs on devices it lacks
        plan.execute()


def test_disk_offload_runs_like_transformers(saved, tmp_path):
    cls, cfg, inputs, directory = saved["llama"]
    model = empty(cls, cfg)
    plan = weightplan.explain(model, directory, device_map="auto", max_memory={"cpu": "200KiB"},
                              offload_folder=tmp_path / "ours")
    on_disk = [m for m, d in plan.device_map.items() if d == "disk"]
    assert on_disk and "cpu" in plan.device_map.values()
    report = plan.execute()
    for name, p in model.named_parameters():  # offloaded weights are not resident
        assert p.is_meta == (plan.options.placement.device_of(name) == "disk"), name
    assert report.offloaded and all(os.path.isfile(f) for f in report.offloaded.values())
    planned = {u.device: u.weights for u in plan.options.placement.uses if u.weights}
    assert set(report.device_bytes) == set(planned)  # the estimate, device by device
    for device, nbytes in report.device_bytes.items():
        assert abs(nbytes - planned[device]) <= 0.05 * planned[device], device
    assert report.staging_bytes == 0 and "on devices: cpu" in str(report)
    reference = pretrained(cls, directory, device_map=plan.device_map,
                           offload_folder=str(tmp_path / "theirs"))
    assert torch.equal(output(model, inputs), output(reference, inputs))


def test_from_pretrained_takes_the_words(saved, tmp_path):
    cls, cfg, inputs, directory = saved["mixtral"]
    model = weightplan.from_pretrained(directory, device_map="sequential",
                                       max_memory={"cpu": "400KiB"}, offload_folder=tmp_path)
    assert any(p.is_meta for p in model.parameters())
    assert torch.equal(output(model, inputs), output(pretrained(cls, directory), inputs))


def test_without_max_memory_this_machine_decides(saved):
    cls, cfg, _, directory = saved["llama"]
    plan = weightplan.explain(empty(cls, cfg), directory, device_map="auto")
    assert plan.device_map == {"": "cpu"} and not plan.options.placement.absent


def test_automatic_placement_and_tp_are_exclusive(saved):
    cls, cfg, _, directory = saved["llama"]
    with pytest.raises(ArgumentError, match="exclusive"):
        weightplan.explain(empty(cls, cfg), directory, device_map="auto", tp="auto")


def test_a_dict_map_naming_the_disk_and_tp_are_exclusive(saved, tmp_path):
    """As an automatic placement: a rank's shards are not offloaded (was planned, each
    rank's part written to the disk for accelerate's hooks around a sharded model)."""
    cls, cfg, _, directory = saved["llama"]
    with pytest.raises(ParallelError, match="exclusive"):
        weightplan.explain(empty(cls, cfg), directory, device=EXPLICIT, offload_folder=tmp_path,
                           tp=weightplan.TensorParallel(world_size=2, rank=0))


def test_the_disk_needs_a_folder_for_converted_tensors_and_words_need_a_strategy(saved):
    """As transformers: a tensor converted on its way to the disk (mixtral's fused experts)
    needs offload_folder (transformers: "needed to be re-saved ... provide an
    offload_folder"); tensors the checkpoint holds as they are are read back from it."""
    cls, cfg, _, directory = saved["mixtral"]
    with pytest.raises(PlanError, match=r"experts.*merged from .* offload_folder="):
        weightplan.explain(empty(cls, cfg), directory, device_map="auto",
                           max_memory={"cpu": "100KiB"})
    with pytest.raises(PlanError, match="automatic placement"):
        weightplan.explain(empty(cls, cfg), directory, max_memory={"cpu": "1GiB"})
    with pytest.raises(PlanError, match="offload_folder"):  # (a dict naming the disk too)
        weightplan.from_pretrained(directory, device_map={"": "disk"})
    with pytest.raises(ValueError, match="offload_folder"):
        pretrained(cls, directory, device_map={"": "disk"})


@pytest.mark.parametrize("device_map", ["auto", {"": "disk"}])
def test_tensors_read_back_in_place_need_no_folder(saved, device_map):
    """llama's tensors are all in the checkpoint as they are: transformers offloads them
    without offload_folder (was refused here: "pass offload_folder=")."""
    cls, _, inputs, directory = saved["llama"]
    words = {"device_map": device_map, "max_memory": {"cpu": "100KiB"}} \
        if device_map == "auto" else {"device_map": device_map}
    model = weightplan.from_pretrained(directory, **words)
    reference = pretrained(cls, directory, **words)
    assert model.hf_device_map == reference.hf_device_map and "disk" in str(model.hf_device_map)
    assert torch.equal(output(model, inputs), output(reference, inputs))


EXPLICIT = {"model.embed_tokens": "cpu", "model.layers": "disk", "model.norm": "cpu",
            "model.rotary_emb": "cpu", "lm_head": "cpu"}


@pytest.mark.parametrize("family", ["llama", "mixtral"])  # (mixtral: experts written, fused)
@pytest.mark.parametrize("device_map", [EXPLICIT, {"": "disk"}])
def test_a_dict_map_naming_the_disk_runs_like_transformers(saved, tmp_path, family, device_map):
    cls, _, inputs, directory = saved[family]
    model = weightplan.from_pretrained(directory, device_map=device_map,
                                       offload_folder=tmp_path / "ours")
    for name, p in model.named_parameters():  # what the map puts on the disk is not resident
        assert p.is_meta == any(name == k or name.startswith(k + ".") or not k
                                for k, d in device_map.items() if d == "disk"), name
    reference = pretrained(cls, directory, device_map=device_map,
                           offload_folder=str(tmp_path / "theirs"))
    assert model.hf_device_map == reference.hf_device_map == device_map
    assert torch.equal(output(model, inputs), output(reference, inputs))


def test_a_dict_map_naming_the_disk_is_complete_and_flat(saved, tmp_path):
    cls, cfg, _, directory = saved["llama"]
    partial = {"model.layers": "disk", "lm_head": "cpu"}  # transformers: a ValueError too
    with pytest.raises(PlanError, match="model.embed_tokens.weight, model.norm.weight"):
        weightplan.explain(empty(cls, cfg), directory, device_map=partial,
                           offload_folder=tmp_path)
    nested = {"model.layers.1": "disk", "": "cpu"}  # accelerate's dispatch fails it
    with pytest.raises(PlanError, match="inside"):
        weightplan.explain(empty(cls, cfg), directory, device_map=nested,
                           offload_folder=tmp_path)


def test_max_memory_bounds_the_devices_of_a_dict_map_naming_the_disk(saved, tmp_path):
    """A dict map naming "disk" takes ``max_memory`` (was refused: "drop max_memory="): each
    budget bounds the device the map names (its planned peak checked, the CPU's bounding the
    read window, as for an automatic placement); nothing is moved."""
    from weightplan.errors import BudgetError

    cls, cfg, _, directory = saved["llama"]
    plan = weightplan.explain(empty(cls, cfg), directory, device_map=EXPLICIT,
                              max_memory={"cpu": "1GiB", "disk": "1GiB"})
    assert plan.device_map == EXPLICIT
    budgets = {u.device: u.budget for u in plan.options.placement.uses}
    assert budgets == {"cpu": 1 << 30, "disk": 1 << 30}
    assert plan.schedule.window_bytes == (1 << 30) // 8  # (the CPU's budget bounds it)
    assert "1 GiB" in str(plan).split("devices (device_map='dict'", 1)[1].splitlines()[2]
    with pytest.raises(BudgetError, match=r"device_map: cpu would hold .* > its max_memory "
                                          r"1 KiB") as e:
        weightplan.explain(empty(cls, cfg), directory, device_map=EXPLICIT,
                           max_memory={"cpu": "1KiB"})
    assert e.value.minimum_bytes > 1024
    model = weightplan.from_pretrained(directory, device_map=EXPLICIT,
                                       max_memory={"cpu": "1GiB"})  # (it loads, as mapped)
    assert model.hf_device_map == EXPLICIT
    with pytest.raises(BudgetError, match="device_map: disk would hold"):
        weightplan.explain(empty(cls, cfg), directory, device_map=EXPLICIT,
                           max_memory={"disk": "1KiB"})
    with pytest.raises(PlanError, match=r"max_memory names cuda:0, where the map puts "
                                        r"nothing \(it uses cpu, disk\)"):
        weightplan.explain(empty(cls, cfg), directory, device_map=EXPLICIT,
                           max_memory={"cuda:0": "1GiB", "cpu": "1GiB"})


def test_cli_dry_run(saved, capsys):
    _, _, _, directory = saved["mixtral"]
    assert main(["explain", str(directory), "--device-map", "auto", "--max-memory",
                 "cuda:0=80KiB,cuda:1=80KiB,cpu=200GiB"]) == 0
    out = capsys.readouterr().out
    assert "cuda:1 (absent)" in out and "device map:" in out
    assert main(["explain", str(directory), "--device-map", "auto", "--json",
                 "--max-memory", "cuda:0=80GiB"]) == 0
    assert json.loads(capsys.readouterr().out)["device_map"] == {"": "cuda:0"}


def test_a_cpu_budget_below_the_reads_of_tensors_referenced_in_place_loads(tmp_path):
    """max_memory={"cpu": "40KiB"} with a tiny gpt-oss: transformers offloads the whole model
    to the disk and runs; weightplan refused ("cpu would hold 96.1 KiB > its max_memory"):
    it counted the host temporaries of reads that the disk's tensors, referenced in place in
    the checkpoint, never make. Now the CPU holds the temporaries of the schedule that runs."""
    import transformers as T

    config = T.GptOssConfig(hidden_size=64, intermediate_size=96, num_local_experts=4,
                            num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, vocab_size=128,
                            layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    T.GptOssForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path / "base")
    words = dict(device_map="auto", max_memory={"cpu": "40KiB"})
    model = weightplan.from_pretrained(tmp_path / "base", offload_folder=tmp_path / "ours",
                                       **words)
    reference = pretrained(T.GptOssForCausalLM, tmp_path / "base",
                           offload_folder=str(tmp_path / "theirs"), **words)
    assert model.hf_device_map == reference.hf_device_map == {"": "disk"}
    inputs = {"input_ids": torch.tensor([[1, 5, 9, 14, 2]])}
    assert torch.equal(output(model, inputs), output(reference, inputs))
    plan = weightplan.explain(empty(T.GptOssForCausalLM, config), tmp_path / "base",
                              offload_folder=tmp_path / "plan", dtype="auto", **words)
    cpu = next(u for u in plan.options.placement.uses if u.device == "cpu")
    assert cpu.peak <= plan.peak_bytes + 1024  # (nothing read: no host temporaries)
