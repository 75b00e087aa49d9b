"""``weightplan convert --budget``: a conversion planned and run within a memory budget, as a
load's ``budget=`` is (a budget too small is refused at plan time with the minimum); and a
convert that fails leaves nothing behind, so that running it again works."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file

import weightplan
from tests.fp8.test_fp8_interop import same
from tests.quant.checkpoints import quantized_checkpoint
from tests.quant.test_quant_mxfp4 import gptoss  # noqa: F401 (fixture)
from weightplan.cli import main
from weightplan.errors import BudgetError, QuantizationError
from weightplan.planner.tensors.schedule.budget import smallest_peak

pytest.importorskip("compressed_tensors")


@pytest.fixture(scope="module")
def int4(tmp_path_factory):
    return quantized_checkpoint(tmp_path_factory.mktemp("int4"), "int")


def _same_files(a, b):
    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert sorted(x) == sorted(y)
    assert all(same(x[k], y[k]) for k in x)


def test_a_dequantizing_convert_holds_no_more_than_its_budget(tmp_path, int4):
    qdir, _ = int4
    free = weightplan.explain_convert(qdir, tmp_path / "free", dequantize=True)
    least = smallest_peak(free.schedule)
    budget = (least + free.peak_bytes) // 2
    assert least < budget < free.peak_bytes  # (the budget changes the schedule)
    plan = weightplan.explain_convert(qdir, tmp_path / "tight", dequantize=True, budget=budget)
    assert plan.options.budget == budget and plan.peak_bytes <= budget
    assert plan.schedule.window_bytes < free.schedule.window_bytes
    report = plan.execute()
    assert 0 < report.peak_bytes <= budget, (report.peak_bytes, budget)  # what it held
    free.execute()
    _same_files(tmp_path / "tight", tmp_path / "free")


def test_a_budget_too_small_is_refused_with_the_minimum(tmp_path, int4):
    qdir, _ = int4
    least = smallest_peak(weightplan.explain_convert(qdir, tmp_path / "o",
                                                     dequantize=True).schedule)
    with pytest.raises(BudgetError) as info:
        weightplan.explain_convert(qdir, tmp_path / "o", dequantize=True, budget=least - 1)
    assert info.value.minimum_bytes == least
    assert not (tmp_path / "o").exists()
    plan = weightplan.explain_convert(qdir, tmp_path / "o", dequantize=True,
                                      budget=f"{least}B")
    assert plan.execute().peak_bytes <= least


def test_cli_convert_budget(tmp_path, int4, capsys):
    qdir, _ = int4
    out = tmp_path / "o"
    assert main(["convert", str(qdir), str(out), "--dequantize", "--budget", "1KiB"]) == 5
    err = capsys.readouterr().err
    assert "BudgetError" in err and "smallest possible peak" in err, err
    assert not out.exists()
    assert main(["convert", str(qdir), str(out), "--dequantize", "--budget", "4MiB"]) == 0
    assert "budget 4 MiB" in capsys.readouterr().out


def test_cli_convert_help_names_budget(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    assert "--budget" in capsys.readouterr().out


def test_a_failed_convert_leaves_no_directory_and_runs_again(tmp_path, gptoss):  # noqa: F811
    """A re-encode that fails in its run (a tile too wide for E4M3, found only when its
    values are read) removes the directories it created; a directory that was there stays."""
    from safetensors.torch import save_file

    qdir, _ = gptoss
    bad = tmp_path / "wide"
    shutil.copytree(qdir, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    key = "model.layers.1.mlp.experts.down_proj_scales"
    tensors[key] = tensors[key].clone()
    tensors[key][1, 0, 0], tensors[key][1, 1, 0] = 127 + 30, 127 - 30
    save_file(tensors, str(bad / "model.safetensors"))
    out = tmp_path / "new" / "deeper"
    with pytest.raises(QuantizationError):
        weightplan.explain_convert(bad, out, to="fp8").execute()
    assert not (tmp_path / "new").exists()
    assert main(["convert", str(bad), str(out), "--to", "fp8"]) == 5
    assert not (tmp_path / "new").exists()
    (tmp_path / "there").mkdir()
    with pytest.raises(QuantizationError):
        weightplan.explain_convert(bad, tmp_path / "there", to="fp8").execute()
    assert (tmp_path / "there").is_dir() and not any((tmp_path / "there").iterdir())
    weightplan.explain_convert(qdir, out, to="fp8").execute()  # the rerun, from a good source
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()


def test_a_packed_copy_in_the_models_layout_says_what_loads_it(tmp_path, int4):
    """A packed checkpoint converted into the model's layout keeps its packed experts
    merged (``experts.gate_up_proj_packed``): a floating model built by from_pretrained
    can't take them, so the plan says so and what to do; a dequantized copy loads."""
    qdir, odir = int4
    plan = weightplan.explain_convert(qdir, tmp_path / "kept")
    notes = " ".join(n.message for n in plan.notes)
    assert "keep their packed format" in notes and "--dequantize" in notes, notes
    assert "keep their packed format" in str(plan)
    plain = weightplan.explain_convert(qdir, tmp_path / "deq", dequantize=True)
    assert "keep their packed format" not in str(plain)


def test_a_convert_does_not_import_torch_distributed_tensor(tmp_path, int4):
    """Asking whether the tensors saved are a tensor-parallel model's imported
    ``torch.distributed.tensor`` even for files: ~33 MiB of RSS, which a dequantizing
    convert at ``--budget 64MiB`` held on top of its planned 62.5 MiB (VmHWM grew 111 MiB;
    68 MiB without it). Probed in a fresh process, where the import is paid."""
    import subprocess
    import sys

    qdir, _ = int4
    code = ("import sys, weightplan\n"
            f"weightplan.explain_convert({str(qdir)!r}, {str(tmp_path / 'out')!r}, "
            "dequantize=True, budget='64MiB').execute()\n"
            "print('torch.distributed.tensor' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stdout + done.stderr
    assert (tmp_path / "out" / "model.safetensors").exists()
