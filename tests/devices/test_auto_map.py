"""The automatic device map's fill, on hand-built module trees: whole blocks, ties, the
staging copies counted in a device's peak, the strategies, the budgets' words."""

import pytest
import torch

from weightplan.errors import BudgetError, PlanError
from weightplan.planner.inputs.module_tree import ModuleNode, ModuleTree, module_tree
from weightplan.planner.tensors.schedule.auto_map import FillInput, Slot, fill, largest_whole
from weightplan.planner.tensors.schedule.device_plan import HostCosts, _converged
from weightplan.planner.tensors.schedule.device_budgets import (
    DeviceBudget, device_name, parse_max_memory,
)


def tree(layers: int = 4, whole_layers: bool = True) -> ModuleTree:
    """root → embed, layers.{i} (a, b), head; every tensor 100 bytes."""
    nodes = {"": ModuleNode("", "M", (), ("embed", "layers", "head"), False),
             "embed": ModuleNode("embed", "E", ("embed.w",), (), True),
             "head": ModuleNode("head", "H", ("head.w",), (), True),
             "layers": ModuleNode("layers", "L", (), tuple(f"layers.{i}" for i in range(layers)),
                                  False)}
    for i in range(layers):
        name = f"layers.{i}"
        nodes[name] = ModuleNode(name, "Block", (), (f"{name}.a", f"{name}.b"), whole_layers)
        for part in "ab":
            nodes[f"{name}.{part}"] = ModuleNode(f"{name}.{part}", "Lin", (f"{name}.{part}.w",),
                                                 (), True)
    return ModuleTree(nodes, ("Block",) if whole_layers else (), {})


def inputs(t: ModuleTree, ties: dict[str, str] | None = None, temp: int = 0,
           concurrent: int = 1) -> FillInput:
    names = [n for node in t.modules.values() for n in node.tensors]
    canon = {n: n for n in names} | (ties or {})
    size = {canon[n]: 100 for n in names}
    return FillInput(t, canon, size, {c: temp for c in size}, concurrent)


def weights(inp: FillInput, result: dict[str, str]) -> dict[str, int]:
    per: dict[str, set[str]] = {}
    for unit, device in result.items():
        per.setdefault(device, set()).update(inp.tensors(unit))
    return {d: inp.bytes_of(frozenset(ts)) for d, ts in per.items()}


def test_everything_on_the_first_device_when_it_fits():
    inp = inputs(tree())
    assert fill(inp, [Slot("cuda:0", 1000, 0, True), Slot("cpu", 1000)]) == {"": "cuda:0"}


def test_blocks_stay_whole_and_spill_in_order():
    inp = inputs(tree())
    result = fill(inp, [Slot("cuda:0", 450, 0, True), Slot("cuda:1", 450, 0, True),
                        Slot("cpu", 10_000), Slot("disk", None)])
    assert result == {"embed": "cuda:0", "layers.0": "cuda:0", "layers.1": "cuda:1",
                      "layers.2": "cuda:1", "layers.3": "cpu", "head": "cpu"}
    for unit in result:  # a block is never split
        assert not unit.endswith((".a", ".b"))
    assert all(w <= 450 for d, w in weights(inp, result).items() if d.startswith("cuda"))


def test_without_no_split_blocks_layers_split():
    inp = inputs(tree(whole_layers=False))
    result = fill(inp, [Slot("cuda:0", 250, 0, True), Slot("cpu", 10_000)])
    assert result["layers.0.a"] == "cuda:0" and result["layers.0.b"] == "cpu"


def test_staging_copies_count_in_an_accelerator_peak():
    """A 100-byte tensor loaded through a 100-byte staging copy needs 200 bytes free."""
    plain = fill(inputs(tree()), [Slot("cuda:0", 500, 0, True), Slot("cpu", 10_000)])
    staged = fill(inputs(tree(), temp=100), [Slot("cuda:0", 500, 0, True), Slot("cpu", 10_000)])
    assert weights(inputs(tree()), plain)["cuda:0"] == 500
    assert weights(inputs(tree()), staged)["cuda:0"] == 300  # + one copy in flight = 400
    two = fill(inputs(tree(), temp=100, concurrent=2),
               [Slot("cuda:0", 500, 0, True), Slot("cpu", 10_000)])
    assert weights(inputs(tree()), two)["cuda:0"] == 300  # 300 + two copies = 500


def test_the_cpu_fixed_part_comes_off_its_budget():
    inp = inputs(tree())
    result = fill(inp, [Slot("cpu", 700, fixed=300), Slot("disk", None)])
    assert weights(inp, result) == {"cpu": 300, "disk": 700}  # 1000 in all


def test_tied_tensors_land_on_one_device():
    inp = inputs(tree(), ties={"head.w": "embed.w"})  # the head reuses the embedding
    result = fill(inp, [Slot("cuda:0", 150, 0, True), Slot("cuda:1", 1000, 0, True)])
    device = {u: d for u, d in result.items()}
    assert device.get("embed", device.get("")) == device.get("head", device.get(""))
    assert weights(inp, result)["cuda:0"] <= 150
    both = fill(inp, [Slot("cuda:0", 1000, 0, True)])
    assert both == {"": "cuda:0"} and inp.bytes_of(inp.tensors("")) == 900  # counted once


def test_a_bounded_last_device_that_is_full_raises():
    with pytest.raises(BudgetError, match="fits on no device"):
        fill(inputs(tree()), [Slot("cpu", 100), Slot("disk", 200)])


def test_largest_whole_is_a_block():
    assert largest_whole(inputs(tree())) == 200
    assert largest_whole(inputs(tree(whole_layers=False))) == 100


def test_module_tree_reads_no_split_and_non_persistent_buffers():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

    class Net(torch.nn.Module):
        _no_split_modules = ["Block"]

        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(), Block()])
            self.register_buffer("scratch", torch.zeros(4), persistent=False)

    t = module_tree(Net())
    assert t.no_split == ("Block",)
    assert t.node("blocks.0").whole and not t.node("blocks").whole
    assert t.node("blocks.0.lin").tensors == ("blocks.0.lin.weight", "blocks.0.lin.bias")
    assert dict(t.extra_bytes) == {"scratch": 16}


def test_max_memory_words():
    budgets = parse_max_memory({"cpu": "1GiB", 1: 100, "cuda:0": "2KiB"})
    assert [b.device for b in budgets] == ["cuda:0", "cuda:1", "cpu", "disk"]
    assert budgets[0].budget == 2048 and budgets[1].budget == 100
    assert budgets[-1] == DeviceBudget("disk", None, True)
    if not torch.cuda.is_available():
        assert not budgets[0].present
    assert device_name("cuda") == "cuda:0" and device_name(torch.device("cpu")) == "cpu"
    with pytest.raises(PlanError, match="not a device"):
        parse_max_memory({"gpu:0": "1GiB"})
    with pytest.raises(PlanError, match="twice"):
        parse_max_memory({0: "1GiB", "cuda:0": "1GiB"})
    with pytest.raises(PlanError, match="max_memory"):
        parse_max_memory({"cpu": "lots"})


def test_an_unsettled_pinned_pool_returns_the_slots_it_filled():
    """The placement's pool may not settle (here: one that grows with what the CPU holds,
    so it swings between 0 and 900): the result is still the fill of the slots returned,
    and the CPU's room covers the result's pool (was: the last pool's slots, refilled by
    nobody, beside the fill of the pool before)."""
    inp = inputs(tree())
    budgets = [DeviceBudget("cuda:0", 300, False), DeviceBudget("cpu", 700, True),
               DeviceBudget("disk", None, True)]

    def pinned_of(result: dict[str, str]) -> int:
        return 300 * sum(1 for d in result.values() if d == "cpu")

    result, slots, pinned = _converged("sequential", budgets, inp, HostCosts(0, 0), 200, 0,
                                       pinned_of)
    assert fill(inp, slots) == result
    cpu = next(s for s in slots if s.device == "cpu")
    assert cpu.fixed - cpu.kept == pinned >= pinned_of(result)
