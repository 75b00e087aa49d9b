"""The README's Python blocks, run in order in one namespace as a user pastes them into one
session, in a directory holding the checkpoints they name: ``ckpt_dir/`` and ``ckpt/`` (a tiny
Mixtral as transformers' ``save_pretrained`` writes it: ``config.json``, per-expert keys),
``base/`` (the same model) and ``lora/`` (a LoRA adapter of it in the per-expert layout peft
saved for transformers v4). No placeholder is substituted: the README names these paths.

A block that can't run here is marked on the line before its fence with
``<!-- not run by tests/test_readme_python.py: needs ... -->``, saying what it needs (the
network, a GPU, torchrun) and where it is tested instead; only those needs are accepted, such
a block must still compile, and the test prints every block it didn't run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
MARK = re.compile(r"<!-- not run by tests/test_readme_python\.py: (needs .*) -->")
NEEDS = ("the network", "a GPU", "torchrun")


def readme_blocks() -> list[tuple[int, str, str | None]]:
    """(line of the fence, code, why it isn't run or ``None``) for every ```python block."""
    lines = README.read_text(encoding="utf-8").splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != "```python":
            continue
        end = lines.index("```", i + 1)
        mark = MARK.fullmatch(lines[i - 1].strip()) if i else None
        blocks.append((i + 1, "\n".join(lines[i + 1:end]) + "\n", mark and mark.group(1)))
    return blocks


def test_only_blocks_that_need_what_a_test_machine_lacks_are_not_run():
    blocks = readme_blocks()
    assert len(blocks) >= 9
    text = README.read_text(encoding="utf-8")
    assert text.count("<!-- not run by tests/test_readme_python.py") == \
        sum(why is not None for _, _, why in blocks)  # (no mark away from a fence)
    for line, code, why in blocks:
        if why is not None:
            assert any(need in why for need in NEEDS), (line, why)
            compile(code, f"README.md:{line}", "exec")  # (Python all the same)
            print(f"README.md:{line}: not run: {why}")
    assert sum(why is None for _, _, why in blocks) >= 6


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from tests.adapters.builders import MIXTRAL, per_expert_adapter, tiny_model

    model = tiny_model("mixtral", layers=4)
    for name in ("ckpt_dir", "ckpt", "base"):
        model.save_pretrained(tmp_path / name)
    per_expert_adapter(str(tmp_path / "lora"), MIXTRAL, layers=4)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_readme_python_block_runs(user_dir, capsys):
    namespace: dict[str, object] = {"__name__": "__readme__"}
    ran = 0
    for line, code, why in readme_blocks():
        if why is not None:
            continue
        try:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"the README's block at line {line} fails: "
                                 f"{type(e).__name__}: {e}\n{code}") from e
        ran += 1
    out = capsys.readouterr().out
    assert ran >= 6 and "weightplan plan:" in out and "adapter:" in out, out
    # what the blocks say they give
    import torch

    tensors, back = namespace["tensors"], namespace["back"]
    assert tensors.keys() == back.keys()
    assert all(torch.equal(tensors[k], back[k]) for k in tensors)
    assert (user_dir / "out_dir" / "config.json").is_file()
    assert {"plan.svg", "layer3.svg", "mem.svg"} <= {p.name for p in user_dir.iterdir()}
    assert (user_dir / "v4" / "adapter_model.safetensors").is_file()
    assert (user_dir / "merged" / "config.json").is_file()
