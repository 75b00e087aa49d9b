"""Small defects of the printed plan (issue 22, item 6), as a user meets them: the text
honours ``--width``, a plan without a model doesn't speak of model memory, the mapping line
is said once, with its legacy renames counted once."""

import pytest
import torch

import weightplan
from weightplan.cli import main
from weightplan.viz.text import explain_text


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=128)
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("llama")
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def _explain(capsys, *argv):
    assert main(["explain", *map(str, argv)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("width", [60, 80])
def test_width_is_honoured_by_every_line(llama_dir, capsys, width):
    out = _explain(capsys, llama_dir, "--width", width)
    assert max(map(len, out.splitlines())) <= width
    default = _explain(capsys, llama_dir)
    assert max(map(len, default.splitlines())) > width  # (printed to a pipe: lines stay whole)
    # the same words, only the line breaks moved (up to the machine's free memory, which moves)
    assert out.split("fits in memory")[0].split() == default.split("fits in memory")[0].split()


def test_a_narrow_row_puts_its_sizes_under_its_key(llama_dir, capsys):
    lines = _explain(capsys, llama_dir, "--width", 60).splitlines()
    at = lines.index("      model.layers.{0,1}.post_attention_layernorm.weight")
    assert lines[at + 1].strip() == "f32[64] ×2  512 B  load"
    assert not any("→ model.layers" in line for line in lines)  # as-is rows name the key once


def test_a_plan_without_a_model_writes_the_returned_tensors(llama_dir):
    text = str(weightplan.explain(None, llama_dir))
    assert "straight into the returned tensors; tensors written:" in text
    assert "model memory" not in text and "model tensors written" not in text


def test_the_mapping_is_said_once(llama_dir):
    with weightplan.init_empty():
        import transformers

        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.from_pretrained(llama_dir))
    from peft import LoraConfig, inject_adapter_in_model

    model = inject_adapter_in_model(LoraConfig(target_modules=["q_proj", "v_proj"], r=4), model)
    plan = weightplan.explain(model, llama_dir)
    text = explain_text(plan)
    assert text.count("no registered mapping") == 1
    mapping = text.splitlines()[1]
    assert mapping.count("legacy renames") == 1 and mapping.endswith("(+6 legacy renames)")
    assert "notes:" not in text
    assert any(n.message == plan.mapping.reason for n in plan.notes)  # still on the plan


def test_packed_dequantizes_name_their_format_and_share_one_header(tmp_path):
    """A compressed-tensors INT4 checkpoint: each weight's row said 'dequantize  → bf16'
    (no format, a double space) under a header of its own, one '#N' per projection."""
    pytest.importorskip("compressed_tensors")
    from tests.conftest import module_with
    from tests.quant.makers import ct_compress, write_checkpoint

    torch.manual_seed(0)
    tensors, model = {}, {}
    for name in ("k_proj", "o_proj", "q_proj", "v_proj"):
        packed, _, _ = ct_compress(torch.randn(16, 64, dtype=torch.bfloat16), "int", "group",
                                   group=32)
        tensors |= {f"attn.{name}.{k}": v for k, v in packed.items()}
        model[f"attn.{name}.weight"] = ((16, 64), torch.bfloat16)
    config = {"quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"g": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
            "symmetric": True}}}}}
    directory = write_checkpoint(tmp_path / "c", tensors, config)
    text = str(weightplan.explain(module_with(model), directory))
    headers = [line for line in text.splitlines() if line.startswith("#")]
    assert headers == ["#1   dequantize INT4 group 32 → bf16 (per source, with its scale)"], text
    assert "dequantize  →" not in text


def test_an_adapters_base_layer_rename_is_folded_like_keys(tmp_path, capsys):
    """peft's wrappers move every adapted base weight under ``base_layer``: the renaming
    names each module (a regex alternation), which printed as one line of ~8,000 characters
    for a 32-layer Llama with 7 targets, twice. Folded like keys, it is a line."""
    peft = pytest.importorskip("peft")
    import transformers

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=12, num_attention_heads=2,
                                      num_key_value_heads=1)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(tmp_path / "base")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=targets)).save_pretrained(
        tmp_path / "lora")
    out = _explain(capsys, tmp_path / "lora", "--base", tmp_path / "base")
    assert max(map(len, out.splitlines())) < 400, max(out.splitlines(), key=len)
    # (a pattern over layer numbers: \d for layers 0-9, \d\d for 10-11, one alternative)
    assert r"model.layers.\d{1,2}.self_attn.q_proj|" in out
    assert r"\.(weight|bias)$ → \1.base_layer.\2" in out


def test_fold_alternations_folds_literal_alternatives_only():
    from weightplan.viz.folding import fold_alternations

    many = "|".join(rf"model\.layers\.{i}\.mlp\.down_proj" for i in range(12))
    assert (fold_alternations(rf"rename ^({many})\.(weight|bias)$ → \1.base_layer.\2")
            == r"rename ^(model.layers.{0..11}.mlp.down_proj)\.(weight|bias)$ → \1.base_layer.\2")
    regex = r"rename ^(a\d+|b.*|c|d)\.w$ → x"  # not literal: left as it is
    assert fold_alternations(regex) == regex
    runs = r"rename ^(m\.\d\.w|m\.\d\d\.w|n\.\d\d\d\.w|m\.\d\d\d\d\.w|c)\.x$ → y"
    assert (fold_alternations(runs)
            == r"rename ^(c|m.(\d|\d\d|\d\d\d\d).w|n.\d\d\d.w)\.x$ → y")


def test_one_read_is_said_in_the_singular():
    one = str(weightplan.explain(None, {"a": torch.ones(2)}))
    two = str(weightplan.explain(None, {"a": torch.ones(2), "b": torch.ones(2)}))
    assert "reads: 8 B in 1 read, " in one, one
    assert "reads: 16 B in 2 reads, " in two, two


def test_a_rows_multiplier_counts_the_tensors_its_keys_name(tmp_path):
    """A save (or ``convert --reverse``) splits each merged expert stack into per-expert
    tensors: the row named 2 layers × 4 experts × w1/w3 = 16 tensors of [6, 8] but printed
    ``f32[6, 8] ×2  768 B`` (×2: the conversions, one per layer), whose product with the
    shape is a third of the bytes beside it. Found saving a tiny Mixtral as a new user."""
    from tests.conftest import moe_checkpoint, moe_model, write_checkpoint

    ckpt = write_checkpoint(tmp_path / "ckpt", moe_checkpoint())
    model = moe_model(device="cpu")
    weightplan.explain(model, ckpt, mapping="mixtral").execute(progress=False)
    lines = str(weightplan.explain_save(model, tmp_path / "out")).splitlines()
    w1 = next(i for i, line in enumerate(lines) if "experts.{0..3}.w1.weight" in line)
    assert lines[w1 + 1].strip().endswith("f32[6, 8] ×16  3 KiB  write"), lines[w1 + 1]
    w2 = next(line for line in lines if "experts.{0..3}.w2.weight" in line)
    assert w2.strip().endswith("f32[8, 6] ×8  1.5 KiB  write"), w2
    # the load's rows, one target per conversion, are unchanged: ×2 stacks of [4, 12, 8]
    load = str(weightplan.explain(moe_model(), ckpt, mapping="mixtral"))
    assert "f32[4, 12, 8] ×2  3 KiB  load" in load, load


def test_nodes_of_one_rank_are_said_as_such(llama_dir, capsys):
    """``--tp 2 --cooperative --nodes 2 --storage node``: each node is one rank, which reads
    what it holds itself; the totals said 'read once per node of 1 ranks and broadcast
    within it' (network 0 B). Found running the README's --nodes line on 2 ranks."""
    out = _explain(capsys, llama_dir, "--tp", "2", "--cooperative", "--nodes", "2",
                   "--storage", "node")
    assert "1 ranks" not in out, out
    assert ("network 0 B (nodes of one rank: each reads the replicated tensors itself, "
            "nothing to broadcast)") in out, out
