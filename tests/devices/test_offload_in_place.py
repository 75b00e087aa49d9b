"""Disk offload by reference: tensors the checkpoint holds as they are stay there (the
offload index points at the checkpoint's own file, nothing is read or written for them);
converted ones (Mixtral's merged experts) are written to ``offload_folder`` and match."""

import hashlib
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import weightplan
from weightplan.errors import SaveError
from weightplan.planner.tensors.schedule.offload_plan import in_place_source

from tests.interop.matrix import FAMILIES, output, pretrained


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = {}
    for family in ("llama", "mixtral"):
        cls, cfg, inputs = FAMILIES[family]()
        cfg = type(cfg)(**{**cfg.to_dict(), "num_hidden_layers": 6})
        directory = tmp_path_factory.mktemp(family)
        torch.manual_seed(0)
        cls(cfg).save_pretrained(directory)
        out[family] = cls, cfg, inputs, directory
    return out


def fingerprint(directory) -> dict[str, tuple[str, int]]:
    """Each checkpoint file's digest and modification time."""
    return {f.name: (hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_mtime_ns)
            for f in sorted(directory.iterdir()) if f.is_file()}


def offloaded_plan(saved, family, tmp_path, cpu):
    cls, cfg, inputs, directory = saved[family]
    with weightplan.init_empty():
        model = cls(cfg).eval()
    plan = weightplan.explain(model, directory, device_map="auto", max_memory={"cpu": cpu},
                              offload_folder=tmp_path / "ours")
    return model, plan


def test_unconverted_tensors_are_not_copied(saved, tmp_path):
    cls, _, inputs, directory = saved["llama"]
    before = fingerprint(directory)
    model, plan = offloaded_plan(saved, "llama", tmp_path, "200KiB")
    off = plan.options.placement.offload
    on_disk = [n for n, _ in model.named_parameters()
               if plan.options.placement.device_of(n) == "disk"]
    assert on_disk and off.written_bytes == 0
    assert {t.name for t in off.tensors} == set(on_disk)
    assert all(t.referenced and t.file.endswith("model.safetensors") for t in off.tensors)
    planned = {d.key for s in plan.schedule.steps for d in s.destinations}
    assert planned.isdisjoint(on_disk)  # nothing read for them
    report = plan.execute()
    folder = tmp_path / "ours"
    assert not folder.exists() or not any(folder.iterdir())  # nothing written
    assert report.offload_written_bytes == 0
    assert report.device_bytes["disk"] == off.referenced_bytes
    assert all(p.is_meta for n, p in model.named_parameters() if n in on_disk)
    reference = pretrained(cls, directory, device_map=plan.device_map,
                           offload_folder=str(tmp_path / "theirs"))
    assert torch.equal(output(model, inputs), output(reference, inputs))
    assert fingerprint(directory) == before  # the checkpoint is only read


def test_converted_tensors_are_written_and_match(saved, tmp_path):
    cls, _, inputs, directory = saved["mixtral"]
    before = fingerprint(directory)
    model, plan = offloaded_plan(saved, "mixtral", tmp_path, "400KiB")
    off = plan.options.placement.offload
    written = {t.name for t in off.tensors if not t.referenced}
    referenced = {t.name for t in off.tensors if t.referenced}
    assert written and referenced
    assert all(".mlp.experts." in n for n in written)  # merged from per-expert tensors
    assert all(t.why_written.startswith("merged from") for t in off.tensors if not t.referenced)
    report = plan.execute()
    files = set(os.listdir(tmp_path / "ours"))
    assert files == {f"{n}.safetensors" for n in written}
    assert report.offload_written_bytes == off.written_bytes
    full = pretrained(cls, directory)
    for name in written:  # the written bytes are what transformers' own load holds
        with safe_open(str(tmp_path / "ours" / f"{name}.safetensors"), "pt") as f:
            assert torch.equal(f.get_tensor(name), full.get_parameter(name)), name
    reference = pretrained(cls, directory, device_map=plan.device_map,
                           offload_folder=str(tmp_path / "theirs"))
    assert torch.equal(output(model, inputs), output(reference, inputs))
    assert torch.equal(output(model, inputs), output(full, inputs))
    assert fingerprint(directory) == before


def test_the_plan_shows_referenced_and_written(saved, tmp_path):
    _, plan = offloaded_plan(saved, "mixtral", tmp_path, "400KiB")
    off = plan.options.placement.offload
    text = str(plan)
    assert "referenced in place in the checkpoint" in text and "written to" in text
    assert "model.layers.5: 7 referenced, 2 written" in text
    data = plan.to_dict()["devices"]["offload"]
    assert data["written_bytes"] == off.written_bytes > 0
    assert data["referenced_bytes"] == off.referenced_bytes > 0
    layer = data["modules"]["model.layers.5"]
    assert layer["referenced"] == 7 and layer["written"] == 2
    assert layer["bytes_written"] == sum(t.nbytes for t in off.tensors if not t.referenced
                                         and t.name.startswith("model.layers.5."))
    gate = data["tensors"]["model.layers.5.mlp.experts.gate_up_proj"]
    assert not gate["referenced"] and gate["file"] is None
    norm = data["tensors"]["model.norm.weight"]
    assert norm["referenced"] and norm["weight_name"] == "model.norm.weight"


def test_only_whole_plain_copies_are_referenced(saved):
    cls, cfg, _, directory = saved["mixtral"]
    with weightplan.init_empty():
        model = cls(cfg)
    plan = weightplan.explain(model, directory)
    for step in plan.schedule.steps:
        source = in_place_source(step)
        dest = step.destinations[0]
        if ".mlp.experts." in dest.key:  # merged: several reads into one tensor
            assert source is None, dest.key
        else:
            assert source == (step.reads[0].entry.file, step.reads[0].entry.key), dest.key
    bf16 = weightplan.explain(model, directory, dtype=torch.bfloat16)  # a cast: still whole
    step = next(s for s in bf16.schedule.steps if s.destinations[0].key == "model.norm.weight")
    assert step.destinations[0].spec.dtype == torch.bfloat16 and in_place_source(step)


CPU = {torch.float32: "400KiB", torch.bfloat16: "200KiB"}  # part of the model on the disk


def test_written_tensors_stream_unless_converted_on_the_host(saved, tmp_path):
    """Merged experts (direct byte copies) are streamed into their files, no host tensor;
    cast ones are staged (assembled in host memory, then written). Both hold what
    transformers' own load holds."""
    cls, _, _, directory = saved["mixtral"]
    reference = {torch.float32: pretrained(cls, directory),
                 torch.bfloat16: pretrained(cls, directory, dtype=torch.bfloat16)}
    for dtype, staged in ((torch.float32, False), (torch.bfloat16, True)):
        with weightplan.init_empty():
            model = cls(saved["mixtral"][1]).eval()
        folder = tmp_path / str(dtype)
        plan = weightplan.explain(model, directory, device_map="auto", dtype=dtype,
                                  max_memory={"cpu": CPU[dtype]}, offload_folder=folder)
        off = plan.options.placement.offload
        written = [t for t in off.tensors if not t.referenced]
        assert written and all(t.staged == staged for t in written), dtype
        assert off.staged_bytes == (off.written_bytes if staged else 0)
        assert off.streamed_names() == (frozenset() if staged else {t.name for t in written})
        report = plan.execute()
        assert report.offload_written_bytes == off.written_bytes
        for t in written:
            with safe_open(str(folder / f"{t.name}.safetensors"), "pt") as f:
                value = f.get_tensor(t.name)
            assert torch.equal(value, reference[dtype].get_parameter(t.name)), t.name


def test_the_cpu_reserves_host_room_only_for_staged_tensors(saved, tmp_path):
    """The placement's host side counts the tensors on their way to the disk only when they
    are held in host memory (staged): referenced and streamed ones take none."""
    from weightplan.planner.pipelines.devices import automatic_request, host_costs
    from weightplan.planner.tensors.schedule.device_plan import fill_input
    from weightplan.planner.inputs.module_tree import module_tree

    cls, cfg, _, directory = saved["mixtral"]
    for dtype in (torch.float32, torch.bfloat16):
        with weightplan.init_empty():
            model = cls(cfg).eval()
        plain = weightplan.explain(model, directory, dtype=dtype)
        inp = fill_input(module_tree(model), plain.model_info, plain.schedule.steps, dtype,
                         plain.schedule.threads)
        for step in plain.schedule.steps:
            for d in step.destinations:
                # whole copies: referenced in place (a bf16 one cast by the hooks' loader);
                # merged experts: streamed (fp32) or, cast by the load, staged (bf16)
                held = inp.host_offloaded[d.key]
                staged = dtype == torch.bfloat16 and ".mlp.experts." in d.key
                assert held == (d.spec.nbytes if staged else 0), d.key
        request = automatic_request("auto", {"cpu": CPU[dtype]}, tmp_path, model, None)
        temporaries = host_costs(request.windowed(plain.schedule)).temporaries
        plan = weightplan.explain(model, directory, device_map="auto", dtype=dtype,
                                  max_memory={"cpu": CPU[dtype]}, offload_folder=tmp_path)
        placement = plan.options.placement
        cpu = next(u for u in placement.uses if u.device == "cpu")
        off = placement.offload
        # the reads that run (none for the referenced), the staged counted on their own
        temporaries = min(temporaries, host_costs(plan.schedule).temporaries)
        resident = sum(b.numel() * b.element_size() for n, b in model.named_buffers()
                       if placement.device_of(n) == "disk")  # (buffers stay in memory)
        assert cpu.resident == resident  # (counted apart: not against max_memory)
        if dtype == torch.float32:  # nothing held on its way to the disk
            assert off.staged_bytes == 0 and cpu.staging == temporaries
        else:  # a window of the staged tensors (the experts), at most all of them
            assert 0 < cpu.staging - temporaries <= off.staged_bytes


def test_tensors_written_to_the_disk_are_not_counted_as_held(saved, tmp_path):
    """The memory model holds what the executor holds: a streamed tensor never takes host
    memory, a staged one only until its step finishes and writes it; neither stays resident.
    The plan's estimate bounds what the executor counts, inside the CPU's planned peak, its
    resident bytes are the CPU's after the load, and read inline (one read at a time: no
    overlap of reader threads to guess) the two agree within 5%."""
    cls, cfg, _, directory = saved["mixtral"]
    for dtype, threads in ((torch.float32, 0), (torch.bfloat16, 0), (torch.float32, 4),
                           (torch.bfloat16, 4)):  # merged experts streamed / cast, staged
        with weightplan.init_empty():
            model = cls(cfg).eval()
        plan = weightplan.explain(model, directory, device_map="auto", dtype=dtype,
                                  max_memory={"cpu": CPU[dtype]}, threads=threads,
                                  offload_folder=tmp_path / f"{dtype}-{threads}")
        placement = plan.options.placement
        off = placement.offload
        cpu = next(u for u in placement.uses if u.device == "cpu")
        steps = [s for s in plan.schedule.steps if s.offloaded]
        staged = dtype == torch.bfloat16
        assert steps and off.written_bytes
        for step in steps:
            assert step.offload_staged == (step.offloaded if staged else frozenset())
            assert step.dest_bytes == sum(d.spec.nbytes for i, d in enumerate(step.destinations)
                                          if i not in step.offloaded)
        assert sum(s.staged_bytes for s in plan.schedule.steps) == off.staged_bytes
        report = plan.execute()
        resident = plan.schedule.timeline[-1].resident
        assert resident == cpu.weights == report.device_bytes["cpu"]
        assert resident + off.written_bytes > cpu.peak  # (counted whole, it would be over)
        assert report.peak_bytes <= plan.peak_bytes <= cpu.peak, (dtype, threads)
        if not threads:
            assert plan.peak_bytes <= 1.05 * report.peak_bytes, dtype


def test_a_model_built_in_another_dtype_offloads_in_the_plans(saved, tmp_path):
    """A bf16 checkpoint into a model built in float32 (``from_pretrained``'s, loading in the
    config's dtype): the offloaded parameters are left on meta in the plan's bf16, as the
    resident ones are installed, so whole tensors are still read back in place from the
    checkpoint (nothing written) and the model computes in bf16, as transformers' own."""
    cls, cfg, inputs, directory = saved["llama"]
    bf16 = tmp_path / "bf16"
    pretrained(cls, directory, dtype=torch.bfloat16).save_pretrained(bf16)
    model, report = weightplan.from_pretrained(bf16, device_map="auto",
                                               max_memory={"cpu": "60KiB"},
                                               offload_folder=tmp_path / "ours",
                                               return_report=True)
    disk = {n for n, p in model.named_parameters() if p.is_meta}
    assert disk and report.offload_written_bytes == 0 and set(report.offloaded) >= disk
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    theirs = pretrained(cls, bf16, device_map=model.hf_device_map,
                        offload_folder=str(tmp_path / "theirs"))
    assert theirs.dtype == torch.bfloat16
    assert torch.equal(output(model, inputs), output(theirs, inputs))


def test_streamed_files_are_alike_where_the_kernel_cannot_copy(saved, tmp_path, monkeypatch):
    """Streamed reads are copied file to file by the kernel; where it can't (the offload
    folder on another filesystem), out of a window into the file: the same bytes."""
    import errno

    cls, cfg, _, directory = saved["mixtral"]
    files = {}
    for kernel in (True, False):
        if not kernel:
            def refuse(*args):
                raise OSError(errno.EXDEV, "cross-device link")

            monkeypatch.setattr(os, "copy_file_range", refuse)
        with weightplan.init_empty():
            model = cls(cfg).eval()
        folder = tmp_path / str(kernel)
        plan = weightplan.explain(model, directory, device_map="auto", max_memory={"cpu": CPU[
            torch.float32]}, offload_folder=folder)
        assert plan.options.placement.offload.streamed_names()
        plan.execute()
        files[kernel] = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert files[True] == files[False] and files[True]


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_a_model_offloaded_to_the_disk_saves_as_transformers_loads_it(saved, family, tmp_path):
    """``weightplan.save`` of a model loaded with part of it on the disk: the offloaded
    tensors are read from their files (the checkpoint's own, or the ones the load wrote:
    Mixtral's merged experts), the others from memory (was: "N tensor(s) are on the meta
    device and have no values to save", where transformers' save_pretrained saves it)."""
    cls, _, inputs, directory = saved[family]
    model = weightplan.from_pretrained(directory, device_map="auto", max_memory={"cpu": "200KiB"},
                                       offload_folder=tmp_path / "off", progress=False)
    assert "disk" in set(model.hf_device_map.values())
    assert any(p.is_meta for p in model.parameters())
    weightplan.save(model, tmp_path / "out")
    reference = pretrained(cls, directory).state_dict()
    back = pretrained(cls, tmp_path / "out").state_dict()
    assert set(back) == set(reference)
    assert [k for k, v in reference.items() if not torch.equal(back[k], v)] == []
    assert output(pretrained(cls, tmp_path / "out"), inputs).equal(
        output(pretrained(cls, directory), inputs))


def test_a_model_offloaded_from_a_checkpoint_of_another_float_dtype_saves(tmp_path):
    """A bf16 checkpoint loaded with ``dtype=torch.float32`` and part of it on the disk:
    its offloaded tensors are read in place from the bf16 file (the hooks cast them), and a
    save reads them from there as the load recorded them (was: SaveError "... holds
    bf16[32, 32], not the model's torch.float32"); the save equals the one of the model
    loaded whole."""
    cls, cfg, _ = FAMILIES["llama"]()
    cfg = type(cfg)(**{**cfg.to_dict(), "num_hidden_layers": 6})
    torch.manual_seed(0)
    cls(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "ck")
    model = weightplan.from_pretrained(tmp_path / "ck", dtype=torch.float32, device_map="auto",
                                       max_memory={"cpu": "200KiB"},
                                       offload_folder=tmp_path / "off", progress=False)
    assert "disk" in set(model.hf_device_map.values())
    weightplan.save(model, tmp_path / "out")
    whole = weightplan.from_pretrained(tmp_path / "ck", dtype=torch.float32, progress=False)
    weightplan.save(whole, tmp_path / "whole")
    ours, theirs = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("out", "whole"))
    assert set(ours) == set(theirs)
    assert [k for k, v in theirs.items() if ours[k].dtype != v.dtype or
            not torch.equal(ours[k], v)] == []
    # without the record (a mapping given), the save writes the model's dtypes: refused,
    # saying which file holds which, rather than a checkpoint of two dtypes
    with pytest.raises(SaveError, match=r"holds bf16\[32, 32\], not the model's torch.float32"):
        weightplan.save(model, tmp_path / "mapped", mapping="llama")


def test_the_disks_buffers_are_counted_beside_a_full_window(saved, tmp_path):
    """The CPU's planned peak holds the window of staged tensors on their way to the disk
    and, beside it, the non-persistent buffers of the disk's modules (held in memory
    whatever the window). Was: the buffers were carved out of a full window (the window
    counted less by their bytes, the peak short of them); they count apart, never against
    ``max_memory``."""
    from weightplan.planner.pipelines.devices import automatic_request, host_costs
    from weightplan.planner.tensors.schedule.device_plan import _largest_step

    cls, cfg, _, directory = saved["mixtral"]
    with weightplan.init_empty():
        model = cls(cfg).eval()
    plain = weightplan.explain(model, directory, dtype=torch.bfloat16)
    request = automatic_request("auto", {"cpu": "100KiB"}, tmp_path, model, None)
    windowed = request.windowed(plain.schedule)
    window = host_costs(windowed).window + _largest_step(windowed.steps)
    plan = weightplan.explain(model, directory, device_map="auto", dtype=torch.bfloat16,
                              max_memory={"cpu": "100KiB"}, offload_folder=tmp_path)
    placement = plan.options.placement
    cpu = next(u for u in placement.uses if u.device == "cpu")
    temporaries = min(host_costs(windowed).temporaries, host_costs(plan.schedule).temporaries)
    buffers = sum(b.nbytes for n, b in model.named_buffers() if placement.device_of(n) == "disk")
    assert buffers and placement.offload.staged_bytes >= window  # (the window is full)
    assert cpu.resident == buffers
    assert cpu.staging == temporaries + window  # (no CUDA: no pinned pool)
    assert cpu.peak == cpu.weights + temporaries + window + buffers
    report = plan.execute()  # (what the load holds, the buffers beside it)
    held = sum(b.nbytes for b in model.buffers() if b.device.type == "cpu")
    assert report.peak_bytes + held <= cpu.peak
