"""The README's command-line block, run line by line as a user copies it (placeholders replaced
by tiny checkpoints that transformers' and peft's own ``save_pretrained`` wrote), and the
command line's answers to bad input: one line on stderr, its class's exit status (2 for bad
arguments, 3 an unreadable checkpoint, 5 another error), no traceback."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from weightplan.cli import main

from tests.test_cli_status import status_of

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_cli_lines() -> list[str]:
    """The ``sh`` block under ``## Command line``, one command per line, comments dropped."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Command line", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines()
            if line.strip().startswith("weightplan ")]


@pytest.fixture(scope="module")
def user_dirs(tmp_path_factory):
    """A tiny Llama and Mixtral as ``save_pretrained`` writes them, and a peft LoRA adapter
    (8 key/value heads: the README's ``--tp 8`` can run on them, exit 0)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("user")
    torch.manual_seed(0)
    small = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=64)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**small))
    llama.save_pretrained(root / "llama")
    transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **small, num_local_experts=8, num_experts_per_tok=2)).save_pretrained(root / "mixtral")
    lora = peft.get_peft_model(llama, peft.LoraConfig(r=4, lora_alpha=8,
                                                      target_modules=["q_proj", "v_proj"]))
    lora.save_pretrained(root / "lora")
    return root


def argv_of(line: str, root: Path, n: int) -> list[str]:
    """``line`` as a user adapts it: optional ``[...]`` parts kept, placeholders filled."""
    line = re.sub(r"\[([^\]]*)\]", r"\1", line)
    experts = "--ep" in line  # a model with experts to place; Llama's for the --tp-plan entry
    names = {"CKPT_DIR": root / ("mixtral" if experts else "llama"), "CKPT": root / "mixtral",
             "ADAPTER_DIR": root / "lora",
             "BASE_DIR": root / "llama", "SRC": root / "mixtral", "DST": root / f"out{n}",
             "DIR": root / f"dir{n}", "plan.svg": root / f"plan{n}.svg",
             "mem.svg": root / f"mem{n}.svg"}
    return [str(names.get(word, word)) for word in shlex.split(line)[1:]]


def test_the_readme_lists_every_command_and_flag_family():
    text = " ".join(readme_cli_lines())
    for words in ("demo", "explain", "convert", "mappings", "recover", "--tp", "--ep",
                  "--cooperative", "--nodes", "--tp-plan", "--device-map", "--max-memory",
                  "--offload-folder", "--base", "--dequantize", "--budget", "--json"):
        assert words in text, words


def test_every_readme_cli_line_runs(user_dirs, capsys):
    lines = readme_cli_lines()
    assert len(lines) >= 15
    for n, line in enumerate(lines):
        if line.startswith("weightplan recover"):
            (user_dirs / f"dir{n}").mkdir()
        code = main(argv_of(line, user_dirs, n))
        out, err = capsys.readouterr()
        if line.startswith("weightplan convert") and "--dequantize" in line:
            # these fixtures are not quantized: the command says so in one line
            assert code == 5 and err.count("\n") == 1 and "nothing to dequantize" in err, err
            continue
        assert code == 0, f"{line}: exit {code}\n{err}"
        assert "Traceback" not in err and out, line
        assert len(out.splitlines()) < 2000 or "--json" in line, line  # grouped, not per key


@pytest.mark.parametrize("args, says", [
    (["explain", "{root}/nope"], "CheckpointError: {root}/nope: no local file"),
    (["explain", "{root}/pickle"], "UnsafeFormatError"),
    (["convert", "{root}/nope", "{root}/out"], "CheckpointError: {root}/nope: file not found"),
    (["explain", "{root}/llama", "--max-memory", "garbage", "--device-map", "auto"],
     "argument --max-memory: expected DEVICE=SIZE"),
    (["explain", "{root}/llama", "--device-map", "auto", "--max-memory", "cpu=lots"],
     "argument --max-memory: cpu=lots: can't parse the size 'lots'"),
    (["explain", "{root}/llama", "--tp", "0"], "argument --tp: '0': give the number of ranks"),
    (["explain", "{root}/llama", "--max-memory", "cpu=8GiB"],
     "ArgumentError: --max-memory needs --device-map (e.g. --device-map auto)"),
    (["explain", "{root}/llama", "--offload-folder", "x"], "--offload-folder needs --device-map"),
    # the fix in the command line's words, not Python's (offload_folder=)
    (["explain", "{root}/mixtral", "--device-map", "auto", "--max-memory", "cpu=1KiB"],
     "converted, not read back from the checkpoint as they are: pass --offload-folder DIR, "
     "or give the devices more memory"),
    # --device-map takes one device (01d0d8a): its budgets said in the flags' words (was
    # '--max-memory= and offload_folder= size an automatic placement'), the dict map too
    (["explain", "{root}/llama", "--device-map", "cpu", "--max-memory", "cpu=1GiB"],
     "PlanError: --max-memory and --offload-folder size an automatic placement "
     "(--device-map auto, 'balanced', 'balanced_low_0' or 'sequential') or bound a dict map "
     "naming \"disk\": pass one of those, or drop them"),
    (["explain", "{root}/llama", "--ep"], "ArgumentError: --ep needs --tp"),
    # the picture's flags, alone, were ignored (the same text printed, no picture)
    (["explain", "{root}/llama", "--only", "model.layers.0.*"],
     "ArgumentError: --only needs --svg (e.g. --svg plan.svg)"),
    (["explain", "{root}/llama", "--detail", "full"], "--detail needs --svg"),
    (["explain", "{root}/llama", "--no-fold"], "--fold/--no-fold needs --svg"),
    (["explain", "{root}/llama", "--cooperative"], "--cooperative needs --tp"),
    # nodes only group the ranks that share reads: without --cooperative they changed nothing
    (["explain", "{root}/llama", "--tp", "2", "--nodes", "2"],
     "ArgumentError: --nodes needs --tp N --cooperative"),
    (["explain", "{root}/llama", "--tp-plan", "{{}}"], "--tp-plan needs --tp"),
    (["explain", "{root}/llama", "--tp", "2", "--device-map", "auto"], "exclude each other"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["explain", "{root}/llama", "--tpp", "2"],
     "weightplan explain: error: unrecognized arguments: --tpp 2; did you mean --tp or "
     "--tp-plan? (see weightplan explain --help)"),
    # another command's flag: was 'did you mean --json?' (every command's flags were offered)
    (["convert", "{root}/llama", "{root}/out", "--json"],
     "weightplan convert: error: unrecognized arguments: --json; --json is an option of "
     "weightplan explain and mappings, not of convert (see weightplan convert --help)"),
    # the command's own flag before the command: was '--json is an option of weightplan
    # mappings, not of explain' (explain has it)
    (["--json", "explain", "{root}/llama"],
     "weightplan explain: error: unrecognized arguments: --json; --json goes after the "
     "command (weightplan explain ... --json) (see weightplan explain --help)"),
    (["mappings", "--dtype", "bf16", "--dry-run"], "unrecognized arguments: --dtype bf16 "
     "--dry-run; --dtype is an option of weightplan explain, --dry-run of weightplan "
     "convert, not of mappings (see weightplan mappings --help)"),
    (["explain", "{root}/llama/config.json"],
     "NotSafetensorsError: {root}/llama/config.json: not a safetensors file: it is JSON text"),
    # no config.json beside it: the note that keys are explained without a model isn't said
    (["explain", "{root}/garbage/model.safetensors"],
     "{root}/garbage/model.safetensors: not a safetensors file: its header length"),
    (["explain", "{root}/llama", "--svg", "{root}/plan.txt"], "can't draw a plan to"),
    (["explain", "{root}/llama", "--timeline", "{root}/mem.png"], "drawn as SVG"),
    # the demo never mixes its shards into another checkpoint's directory
    (["demo", "--dir", "{root}/pickle"],
     "SaveError: {root}/pickle holds other files (config.json, pytorch_model.bin)"),
    (["demo", "--dir", "{root}/pickle/config.json"], "not a directory"),
])
def test_bad_input_is_one_line_and_its_status(user_dirs, capsys, args, says):
    pickle = user_dirs / "pickle"
    pickle.mkdir(exist_ok=True)
    (pickle / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")  # never unpickled
    (pickle / "config.json").write_bytes((user_dirs / "llama" / "config.json").read_bytes())
    (user_dirs / "garbage").mkdir(exist_ok=True)
    (user_dirs / "garbage" / "model.safetensors").write_bytes(b"not a checkpoint at all")
    argv = [a.format(root=user_dirs) for a in args]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors leave through SystemExit
        code = e.code
    out, err = capsys.readouterr()
    assert code == status_of(err) and not out, (out, err)  # (refused before a plan is printed)
    assert err.count("\n") == 1 and "Traceback" not in err and "usage:" not in err, err
    assert says.format(root=user_dirs) in err, err


def test_convert_without_a_mapping_says_the_flag(tmp_path, capsys):
    from tests.conftest import moe_checkpoint, write_checkpoint

    source = write_checkpoint(tmp_path / "c", moe_checkpoint())
    assert main(["convert", str(source), str(tmp_path / "out")]) == 5
    err = capsys.readouterr().err
    assert "MappingError" in err and "--model-type NAME" in err and "mapping=" not in err


def test_convert_says_its_mapping_came_from_the_config(user_dirs, capsys):
    assert main(["convert", str(user_dirs / "mixtral"), str(user_dirs / "from_config"),
                 "--dry-run"]) == 0
    assert "mapping: mixtral — config.json's model_type 'mixtral'" in capsys.readouterr().out
    assert main(["convert", str(user_dirs / "mixtral"), str(user_dirs / "by_flag"),
                 "--dry-run", "--model-type", "mixtral"]) == 0
    assert "mapping: mixtral — requested mapping 'mixtral'" in capsys.readouterr().out


def test_without_a_config_the_note_follows_the_plan(user_dirs, capsys):
    bare = user_dirs / "bare"
    bare.mkdir(exist_ok=True)
    (bare / "model.safetensors").write_bytes((user_dirs / "llama" / "model.safetensors")
                                             .read_bytes())
    assert main(["explain", str(bare)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"weightplan plan: {bare} (1 file, ")
    assert err == (f"weightplan: no config.json next to {bare}: explained the keys without a "
                   "model (pass --model-type to apply a mapping)\n"), err



def test_the_device_table_is_what_its_command_prints(tmp_path, capsys):
    """The ``devices`` table under ``## Devices`` is what the command written above it prints
    for a 4-layer Llama of 642 KiB (hidden 64, intermediate 128, 2 of 4 heads for key/value):
    the command said ``cuda:0=80GiB,cuda:1=80GiB`` while the table showed budgets of 300 KiB
    and the model split over three devices (with 80 GiB each it all goes to the GPUs)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    section = README.read_text(encoding="utf-8").split("## Devices", 1)[1]
    command = re.search(r"`(weightplan explain DIR --device-map auto --max-memory \S+)`,\nprint:",
                        section)
    table = re.search(r"```\n(devices \(.*?)```", section, re.S)
    assert command is not None and table is not None
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2)).save_pretrained(tmp_path / "llama")
    argv = [str(tmp_path / "llama") if w == "DIR" else w for w in command.group(1).split()]
    assert main(argv[1:]) == 0
    out = capsys.readouterr().out
    printed = out[out.index("devices ("):out.index("problems:")]
    assert printed == table.group(1), printed
