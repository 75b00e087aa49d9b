"""``weightplan explain --device-map``: every error the placement can give the command line
says its fix in flags (``--max-memory``, ``--offload-folder``, ``--device-map auto``), not in
the Python keywords the same error says to a caller (``max_memory``, ``offload_folder=``)."""

from __future__ import annotations

import pytest

import weightplan
from weightplan.cli import main
from weightplan.errors import PlanError

from tests.test_cli_status import status_of

PYTHON_WORDS = ("max_memory", "offload_folder", "device_map=", "device_map:", "pass the model")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("devices")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )).save_pretrained(root / "llama")
    (root / "bare").mkdir()
    (root / "bare" / "model.safetensors").write_bytes(
        (root / "llama" / "model.safetensors").read_bytes())
    (root / "a_file").write_text("")
    from tests.interop.matrix import FAMILIES  # (fused experts: converted on their way to
    cls, config, _ = FAMILIES["mixtral"]()      # the disk, so written to --offload-folder)
    cls(config).save_pretrained(root / "mixtral")
    return root


@pytest.mark.parametrize("args, says", [
    (["--max-memory", "cpu=1KiB", "mixtral"], "--device-map: the devices in --max-memory can't "
     "hold the model, the rest (the whole model) goes to the disk, where 4 tensors"),
    (["--max-memory", "cpu=1KiB", "mixtral"], "are converted, not read back from the "
     "checkpoint as they are: pass --offload-folder DIR, or give the devices more memory"),
    (["--max-memory", "cpu=1KiB", "--offload-folder", "{root}/off", "mixtral"],
     "cpu would hold 12 KiB > its --max-memory 1 KiB"),
    (["--max-memory", "cpu=1KiB,disk=1KiB"], "disk is full too (1 KiB); raise --max-memory"),
    (["--max-memory", "foo=1GiB"], "--max-memory key 'foo' is not a device"),
    (["--max-memory", "meta=1GiB"], "--max-memory: 'meta' holds nothing"),
    (["--max-memory", "cuda:0=1GiB,cuda=1GiB"], "--max-memory names cuda:0 twice ('cuda')"),
    (["--offload-folder", "{root}/a_file"],
     "--offload-folder {root}/a_file exists and is not a directory"),
    # a size that isn't one is the flag's argument error (was PlanError: max_memory['cpu'])
    (["--max-memory", "cpu=lots"], "argument --max-memory: cpu=lots: can't parse the size "
     "'lots': use bytes or a string like '8GiB'"),
])
def test_device_map_errors_speak_in_flags(llama, capsys, args, says):
    name = args[-1] if args[-1] == "mixtral" else "llama"
    argv = ["explain", str(llama / name), "--device-map", "auto",
            *(a.format(root=llama) for a in args if a != "mixtral")]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    assert code == status_of(err) and not out and err.count("\n") == 1, err
    assert says.format(root=llama) in err, err
    assert not [w for w in PYTHON_WORDS if w in err], err


@pytest.mark.parametrize("extra", [[], ["--model-type", "llama"]])
def test_a_device_map_without_a_model_says_what_the_command_needs(llama, capsys, extra):
    where = llama / ("bare" if not extra else "llama")
    assert main(["explain", str(where), "--device-map", "auto", *extra]) == 5
    err = capsys.readouterr().err
    assert ("--device-map auto places a model's modules: give a checkpoint directory with its "
            "config.json (and no --model-type)") in err, err
    assert not [w for w in PYTHON_WORDS if w in err], err


def test_the_same_errors_speak_python_to_a_caller(llama):
    with pytest.raises(PlanError, match="device_map='auto' places a model's modules: pass the "
                                        "model"):
        weightplan.explain(None, llama / "bare", device_map="auto")
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(llama / "mixtral")
    with weightplan.init_empty():
        model = transformers.MixtralForCausalLM(config)
    with pytest.raises(PlanError, match=r"pass offload_folder= \(a directory\)"):
        weightplan.explain(model, llama / "mixtral", device_map="auto",
                           max_memory={"cpu": "1KiB"})


def test_a_gpu_named_by_its_index_as_in_transformers(llama, capsys):
    """``--max-memory 0=...`` is ``max_memory={0: ...}``: GPU 0 (was: "max_memory key '0' is
    not a device: Invalid device string: '0'")."""
    assert main(["explain", str(llama / "llama"), "--device-map", "auto",
                 "--max-memory", "0=60KiB,cpu=1GiB"]) == 0
    out = capsys.readouterr().out
    assert "  cuda:0 (absent)" in out and "60 KiB" in out


def test_repeated_max_memory_flags_add_up(llama, capsys):
    """``--max-memory 0=60KiB --max-memory cpu=1GiB`` is both budgets (was: the last flag
    alone, GPU 0 dropped without a word: the whole model on the CPU)."""
    assert main(["explain", str(llama / "llama"), "--device-map", "auto",
                 "--max-memory", "0=60KiB", "--max-memory", "cpu=1GiB"]) == 0
    out = capsys.readouterr().out
    assert "  cuda:0 (absent)" in out and "60 KiB" in out and "1 GiB" in out
    with pytest.raises(SystemExit):
        main(["explain", str(llama / "llama"), "--device-map", "auto",
              "--max-memory", "cpu=2GiB", "--max-memory", "cpu=1GiB"])
    assert "cpu is given twice" in capsys.readouterr().err
    assert main(["explain", str(llama / "llama"), "--device-map", "auto",
                 "--max-memory", "0=60KiB", "--max-memory", "cuda:0=1GiB"]) == 5
    assert "names cuda:0 twice" in capsys.readouterr().err


SIBLINGS = {"model.embed_tokens": "cpu", "model.layers": "disk", "model.norm": "cpu",
            "model.rotary_emb": "cpu", "lm_head": "cpu"}


@pytest.mark.parametrize("given", ["inline", "file"])
def test_a_dict_device_map_from_the_command_line(llama, capsys, tmp_path, given):
    """``--device-map '{...}'`` (or ``@FILE.json``) is ``device_map={...}``: the map as
    given, "disk" included (was: only the four strategies)."""
    import json

    text = json.dumps(SIBLINGS)
    if given == "file":
        (tmp_path / "map.json").write_text(text)
        text = f"@{tmp_path / 'map.json'}"
    assert main(["explain", str(llama / "llama"), "--device-map", text]) == 0
    out = capsys.readouterr().out
    assert "device map:\n  cpu: lm_head, model.embed_tokens, model.norm, model.rotary_emb\n" \
           "  disk: model.layers\n" in out, out
    assert main(["explain", str(llama / "llama"), "--device-map", text, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device_map"] == SIBLINGS
    assert data["devices"]["strategy"] == "dict" and set(data["device_peaks"]) == {"cpu", "disk"}


def test_one_device_from_the_command_line(llama, capsys):
    import json

    assert main(["explain", str(llama / "llama"), "--device-map", "cpu"]) == 0
    assert "\ndevices: cpu 105 KiB\n" in capsys.readouterr().out
    assert main(["explain", str(llama / "llama"), "--device-map", '{"": "cpu"}', "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["class"] == "LlamaForCausalLM"


@pytest.mark.parametrize("given, says", [
    ('{"model.layers": "gpu0", "": "cpu"}', 'entry "model.layers": "gpu0" is not a device; '
     'give auto, balanced, balanced_low_0, sequential, a device (cpu, cuda:0) or a JSON object'),
    ('{"model.layers": true}', 'entry "model.layers": true is not a device'),
    ('{"model.layers": [0]}', 'entry "model.layers": [0] is not a device'),
    ('{"": "meta"}', 'entry "": "meta" holds nothing: name a real device'),
    ("bogus", '"bogus" is not a device'),
    ("disk", '"disk" is not a device'),  # (the whole model on the disk: a map's entry only)
    ("[1]", "'[1]': give a JSON object {module prefix: device}"),
    ("{}", "'{}': give a JSON object {module prefix: device}"),
    ('{"model": ', """'{"model": ': not a JSON object {module prefix: device} (Expecting"""),
    ("@{root}/nowhere.json", "'@{root}/nowhere.json': not a JSON object {module prefix: "
     "device} ([Errno 2]"),
])
def test_a_bad_device_map_is_named_by_its_entry(llama, capsys, given, says):
    with pytest.raises(SystemExit) as e:
        main(["explain", str(llama / "llama"), "--device-map",
              given.replace("{root}", str(llama))])
    err = capsys.readouterr().err
    assert e.value.code == status_of(err) == 2 and err.count("\n") == 1, err
    assert f"argument --device-map: {says.replace('{root}', str(llama))}" in err, err


def test_budgets_beside_a_dict_map_speak_in_flags(llama, capsys):
    """``--max-memory`` beside a map naming "disk" bounds its devices (was refused)."""
    import json

    given = json.dumps(SIBLINGS)
    argv = ["explain", str(llama / "llama"), "--device-map", given, "--max-memory"]
    assert main([*argv, "cpu=1GiB"]) == 0
    assert "  cpu " in capsys.readouterr().out
    for budget, says in [("cpu=1KiB", "--device-map: cpu would hold "),
                         ("0=1GiB", "--max-memory names cuda:0, where the map puts nothing (it "
                          "uses cpu, disk): drop it from --max-memory, or map modules to it")]:
        assert main([*argv, budget]) == 5
        out, err = capsys.readouterr()
        assert not out and err.count("\n") == 1 and says in err, err
        assert not [w for w in PYTHON_WORDS if w in err], err
