"""A block-FP8 checkpoint is planned and loaded as serving deployments hold it: the CLI and
``from_pretrained`` build the model with transformers' FP8 layers and keep the FP8 weights and
their scales, unless asked to dequantize (``--dequantize`` / ``dequantize=True`` / a dtype);
the plan's header says which it planned."""

import json

import pytest
import torch
from safetensors.torch import load_file

import weightplan
from benchmarks.frontier import write_fixture
from tests.fp8.test_fp8_interop import meta_model, same
from weightplan.cli import main
from weightplan.errors import ArgumentError, ParallelError


@pytest.fixture(scope="module")
def frontier_fp8(tmp_path_factory):
    """DeepSeek-V3 FP8's real key names, shapes and shards, 4 layers, headers only."""
    return write_fixture("deepseek-v3-fp8", tmp_path_factory.mktemp("dsv3-fp8"), layers=4)


def _ranks(capsys, directory, *flags):
    code = main(["explain", str(directory), "--tp", "8", "--ep", "--json", "--allow-problems",
                 *flags])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def test_the_dry_run_holds_the_fp8_weights(frontier_fp8, capsys):
    kept = _ranks(capsys, frontier_fp8)
    dequantized = _ranks(capsys, frontier_fp8, "--dequantize")
    assert len(kept) == len(dequantized) == 8
    for mine, old in zip(kept, dequantized, strict=True):
        assert 0.45 < mine["held_bytes"] / old["held_bytes"] < 0.6  # 1 byte + scales vs 2
        assert mine["peak_bytes"] < old["peak_bytes"]
        assert mine["read_bytes"] == old["read_bytes"]  # the same bytes come off the disk
        assert abs(mine["held_bytes"] - mine["read_bytes"]) < 0.02 * mine["read_bytes"]


def test_the_headers_say_what_was_planned(frontier_fp8, capsys):
    main(["explain", str(frontier_fp8), "--tp", "8", "--ep", "--allow-problems"])
    table = capsys.readouterr().out
    assert "FP8 kept (" in table.splitlines()[1] and "dequantized" not in table.splitlines()[1]
    main(["explain", str(frontier_fp8), "--allow-problems", "--dequantize"])
    header = capsys.readouterr().out.splitlines()[0]
    assert "FP8 dequantized to bfloat16" in header and "kept" not in header
    main(["explain", str(frontier_fp8), "--allow-problems", "--dtype", "bf16"])
    assert "FP8 dequantized to bfloat16" in capsys.readouterr().out.splitlines()[0]
    main(["explain", str(frontier_fp8), "--allow-problems"])
    header = capsys.readouterr().out.splitlines()[0]
    assert "FP8 kept (" in header and "dequantized" not in header  # none the model loads


def test_from_pretrained_keeps_fp8_as_transformers_loads_it(fp8_checkpoints, monkeypatch):
    """transformers can't run FP8 matmuls on a CPU (its kernels are GPU ones), so the
    tensors are compared: its native FP8 load (environment check patched) is the oracle."""
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer
    monkeypatch.setattr(FineGrainedFP8HfQuantizer, "validate_environment",
                        lambda self, *a, **k: None)
    monkeypatch.setattr("weightplan.api.pretrained._fp8_runs_here", lambda: True)  # (its own)
    _, fp8_dir = fp8_checkpoints("dsv3")
    model = weightplan.from_pretrained(fp8_dir, progress=False)
    reference = AutoModelForCausalLM.from_pretrained(fp8_dir)
    assert type(model.model.layers[1].mlp.experts) is type(reference.model.layers[1].mlp.experts)
    assert isinstance(model.config.quantization_config, FineGrainedFP8Config)
    got, expected = model.state_dict(), reference.state_dict()
    assert set(got) == set(expected)
    fp8 = 0
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        assert same(got[key], value), key
        fp8 += value.dtype == torch.float8_e4m3fn
    assert fp8 == 18 and got["model.layers.1.mlp.experts.gate_up_proj"].dtype == \
        torch.float8_e4m3fn


def test_a_kept_model_saves_the_checkpoint_back_bit_for_bit(fp8_checkpoints, tmp_path):
    _, fp8_dir = fp8_checkpoints("mixtral")
    model = weightplan.from_pretrained(fp8_dir, progress=False, dequantize=False)
    weightplan.save(model, tmp_path / "out")
    original = load_file(str(fp8_dir / "model.safetensors"))
    written = {}
    for path in (tmp_path / "out").glob("*.safetensors"):
        written.update(load_file(str(path)))
    assert set(written) == set(original)
    assert all(same(written[k], v) for k, v in original.items())


def test_where_fp8_layers_cannot_run_it_loads_dequantized_as_transformers(
        fp8_checkpoints, monkeypatch):
    """No GPU (of compute capability 8.9+) nor XPU: transformers loads a block-FP8
    checkpoint dequantized to bf16, and so does ``from_pretrained``, saying so (was: FP8
    layers kept, whose first forward failed on this CPU); ``dequantize=False`` keeps them."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # (for both)
    _, fp8_dir = fp8_checkpoints("mixtral")
    with pytest.warns(UserWarning, match="loaded dequantized, as transformers does") as got:
        model = weightplan.from_pretrained(fp8_dir, progress=False)
    assert got[0].filename == __file__  # the caller's line (was: weightplan/api/guard.py)
    reference = AutoModelForCausalLM.from_pretrained(fp8_dir)
    got, expected = model.state_dict(), reference.state_dict()
    assert set(got) == set(expected)
    assert all(got[k].dtype == v.dtype and same(got[k], v) for k, v in expected.items())
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    kept = weightplan.from_pretrained(fp8_dir, progress=False, dequantize=False)
    assert any(p.dtype == torch.float8_e4m3fn for p in kept.parameters())


@pytest.mark.parametrize("field", [{"dequantize": True}, {"scale_fmt": "ue8m0"}])
def test_a_checkpoint_no_model_holds_as_it_is_is_not_warned_about(fp8_checkpoints, field,
                                                                  tmp_path, monkeypatch):
    """FP8 whose config asks to dequantize, or with ue8m0 scales (DeepSeek-V3.1): no model
    holds it as it is, on any machine; loaded dequantized on a CPU without the warning that
    FP8 layers need a GPU and that ``dequantize=False`` keeps them (which it wouldn't)."""
    import shutil
    import warnings

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _, fp8_dir = fp8_checkpoints("mixtral")
    directory = tmp_path / "ck"
    shutil.copytree(fp8_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"].update(field)
    (directory / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = weightplan.from_pretrained(directory, progress=False)
    assert [str(w.message) for w in caught if "FP8 layers need a GPU" in str(w.message)] == []
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("options", [{"dequantize": True}, {"dtype": torch.bfloat16}])
def test_asked_to_dequantize_it_loads_the_old_way(fp8_checkpoints, options):
    _, fp8_dir = fp8_checkpoints("mixtral")
    model = weightplan.from_pretrained(fp8_dir, progress=False, **options)
    assert not any(p.dtype == torch.float8_e4m3fn for p in model.parameters())
    reference = meta_model("mixtral")
    weightplan.load(reference, fp8_dir, dtype=torch.bfloat16)
    got, expected = model.state_dict(), reference.state_dict()
    assert set(got) == set(expected)
    assert all(same(got[k], v) for k, v in expected.items())


def test_dequantize_keyword_is_checked(fp8_checkpoints):
    _, fp8_dir = fp8_checkpoints("mixtral")
    with pytest.raises(ArgumentError, match="dequantize="):
        weightplan.from_pretrained(fp8_dir, dequantize="yes")
    with pytest.raises(ParallelError, match="dequantize=False"):
        weightplan.from_pretrained(fp8_dir, tp="auto", dequantize=False)


def test_the_rank_table_takes_the_width(frontier_fp8, capsys):
    main(["explain", str(frontier_fp8), "--tp", "8", "--ep", "--allow-problems", "--width", "60"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 12 and any("FP8 kept" in line for line in lines)
    assert all(len(line) <= 60 or len(line.split()) == 1 for line in lines)  # a key stays whole


def test_the_command_line_advises_its_own_flag_to_dequantize(fp8_checkpoints, capsys):
    """A kept FP8 weight split inside a block (the tiny DeepSeek's shared experts over 2
    ranks) or without its scale: the advice is ``--dequantize``, not Python's words."""
    directory = fp8_checkpoints("dsv3")[1]
    assert main(["explain", str(directory), "--tp", "2", "--ep"]) == 1
    out = capsys.readouterr().out
    assert "inside a 128×128 block; pass --dequantize" in out, out
    assert "floating model" not in out, out


def test_a_kept_fp8_weight_without_its_scale_is_not_called_unscaled(fp8_checkpoints, tmp_path,
                                                                   capsys):
    """An FP8 weight whose scale is missing is FP8 all the same: the problem says that its
    scale is what's wrong, once, and what to run instead."""
    import shutil

    from safetensors.torch import save_file

    directory = tmp_path / "noscale"
    shutil.copytree(fp8_checkpoints("dsv3")[1], directory)
    tensors = load_file(str(directory / "model.safetensors"))
    key = "model.layers.0.self_attn.q_b_proj.weight"
    del tensors[key + "_scale_inv"]
    save_file(tensors, str(directory / "model.safetensors"))
    assert main(["explain", str(directory)]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "can't keep FP8" in x)
    assert f"{key} keeps FP8 but {key} is f8_e4m3 and has no {key}_scale_inv that fits it" in line, line
    assert "not a scaled FP8 weight" not in line and line.endswith("pass --dequantize instead")


@pytest.mark.parametrize("dequantize", [False, True])
def test_from_pretrained_reads_an_fp8_config_once(fp8_checkpoints, opens, dequantize):
    """The FP8 test, the build, and the plan's quantized phases (its FP8 config, its packed
    format's) all use config.json as read once (was: 6 opens)."""
    _, fp8_dir = fp8_checkpoints("mixtral")
    with opens() as opened:
        model = weightplan.from_pretrained(fp8_dir, progress=False, dequantize=dequantize)
    assert opened["config.json"] == 1, opened
    assert any(p.dtype == torch.float8_e4m3fn for p in model.parameters()) is not dequantize
