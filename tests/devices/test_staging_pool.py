"""The pinned host staging CUDA copies go through is sized by what the load moves there:
buffers the size of the largest tensor copied (at most 32 MiB), never more bytes than go to
CUDA, counted in the CPU's budget (was 8 × 32 MiB whatever the model: a 85 KiB model's
plan showed 256 MiB of CPU staging and a small ``cpu`` budget was refused for it)."""

import pytest
import torch

import weightplan
from weightplan.cli import main
from weightplan.planner.inputs.device import (
    STAGING_BUFFERS, STAGING_CHUNK, StagingPool, staging_pool,
)
from weightplan.planner.pipelines.devices import automatic_request, host_costs
from weightplan.planner.tensors.schedule.device_plan import staging_of

from tests.interop.matrix import FAMILIES

MIB = 1 << 20


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    cls, cfg, _ = FAMILIES["llama"]()
    directory = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    cls(cfg).save_pretrained(directory)
    return cls, cfg, directory


def empty(cls, cfg):
    with weightplan.init_empty():
        return cls(cfg).eval()


@pytest.mark.parametrize("copies, pool", [
    ((), StagingPool()), ((0,), StagingPool()),
    ((12288,), StagingPool(12288, 1)),  # one tensor: one buffer its size
    ((100, 300, 200), StagingPool(300, 2)),  # never more than the 600 bytes moved
    ((STAGING_CHUNK * 3,), StagingPool(STAGING_CHUNK, 3)),  # in chunks
    ((100 * MIB,) * 10, StagingPool(STAGING_CHUNK, STAGING_BUFFERS)),  # at most 256 MiB
])
def test_the_pool_is_bounded_by_what_is_moved(copies, pool):
    got = staging_pool(copies)
    assert got == pool
    assert got.nbytes <= min(sum(copies), STAGING_CHUNK * STAGING_BUFFERS)


def test_a_tiny_model_with_a_gpu_stages_at_most_its_bytes(llama, tmp_path):
    cls, cfg, directory = llama
    model = empty(cls, cfg)
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    plan = weightplan.explain(model, directory, device_map="auto",
                              max_memory={0: "60KiB", "cpu": "2GiB"})
    placement = plan.options.placement
    uses = {u.device: u for u in placement.uses}
    gpu, cpu = uses["cuda:0"], uses["cpu"]
    assert gpu.weights > 0 and not gpu.present  # a dry run: this machine has no GPU 0
    assert 0 < placement.pinned_bytes <= gpu.weights <= model_bytes
    # the executor's stager is sized by the same pool, from the plan's steps and map
    assert staging_of(plan.schedule.steps, plan.options.devices).nbytes == placement.pinned_bytes
    request = automatic_request("auto", {0: "60KiB", "cpu": "2GiB"}, None, empty(cls, cfg), None)
    temporaries = host_costs(request.windowed(plan.schedule)).temporaries
    assert cpu.staging == temporaries + placement.pinned_bytes  # counted in the CPU's
    assert cpu.peak < 2 * model_bytes  # was 256 MiB + the weights
    assert "host staging (pinned, for device copies): 12 KiB, counted in the cpu's" in str(plan)
    assert staging_of(plan.schedule.steps, None) == StagingPool()


@pytest.mark.parametrize("cpu", ["120KiB", "150KiB"])
def test_a_small_cpu_budget_is_not_refused_for_staging_it_does_not_need(llama, cpu):
    """The CPU holds the rest of the model, its temporaries and the pinned pool: within
    ``cpu`` (was refused: the devices couldn't hold the model beside 256 MiB of staging)."""
    cls, cfg, directory = llama
    plan = weightplan.explain(empty(cls, cfg), directory, device_map="auto",
                              max_memory={0: "60KiB", "cpu": cpu})
    uses = {u.device: u for u in plan.options.placement.uses}
    assert uses["cpu"].peak <= uses["cpu"].budget
    assert uses["cuda:0"].weights > 0 and uses["disk"].weights == 0


def test_nothing_on_cuda_stages_nothing(llama):
    cls, cfg, directory = llama
    plan = weightplan.explain(empty(cls, cfg), directory, device_map="auto",
                              max_memory={0: "1KiB", "cpu": "2GiB"})
    assert plan.options.placement.pinned_bytes == 0
    assert "host staging" not in str(plan)


def test_the_cli_shows_the_pool_it_counts(llama, capsys):
    cls, cfg, directory = llama
    main(["explain", str(directory), "--device-map", "auto", "--max-memory", "0=60KiB,cpu=150KiB"])
    out = capsys.readouterr().out
    assert "host staging (pinned, for device copies): 12 KiB" in out  # (was 256 MiB)


def test_the_users_budgets_plan_with_the_disk(llama, tmp_path):
    """``max_memory={0: "60KiB", "cpu": "30KiB"}`` with an offload folder: the rest goes to
    the disk, the CPU holds its temporaries and the 12 KiB pool (was: "cpu would hold
    256 MiB > its max_memory 30 KiB")."""
    cls, cfg, directory = llama
    plan = weightplan.explain(empty(cls, cfg), directory, device_map="auto",
                              max_memory={0: "60KiB", "cpu": "30KiB"}, offload_folder=tmp_path)
    placement = plan.options.placement
    cpu = next(u for u in placement.uses if u.device == "cpu")
    assert placement.pinned_bytes == 12 * 1024 and cpu.peak <= 30 * 1024
    assert any(d == "disk" for _, d in placement.device_map)
