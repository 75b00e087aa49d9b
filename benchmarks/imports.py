"""Import benchmark: what weightplan's own modules cost a process that already has torch
and transformers, on the load path.

Every figure comes from fresh processes (medians of ``--repeat``), with weightplan's
bytecode compiled first (``compileall``, as ``pip install`` leaves it), and is printed
beside the reference measured in the same run: ``import torch, transformers`` in the same
kind of process.

- *first use*: ``weightplan.explain`` looked up after ``import torch, transformers`` (what
  ``import weightplan`` defers: the public API and the planner). Target (issue 20):
  ≤ 50 ms, where it was 80–110 ms.
- *a load's imports*: ``weightplan.explain`` looked up, then every other weightplan module
  a plain load (``explain``, ``print(plan)``, ``execute``, as ``weightplan demo`` runs
  them) imports, in that order: what the user's first load pays beside its reads.
- the module counts: ``weightplan.*`` modules after the first use and after the demo's
  load, and which of them a plain load should not need (saving, converting, resolving a
  tensor-parallel plan, the bridge, DOT). Issue 20's walk bounds (files whose code runs)
  are ``benchmarks/walks.py``'s.

Times are in-process ``perf_counter`` (wall) and ``process_time`` (CPU); on a shared
machine CPU time is the steadier of the two.

    python benchmarks/imports.py [--repeat 9] [--root TREE ...]

``--root`` measures another checkout (its ``weightplan`` package) with this script; several
``--root`` are measured side by side (interleaved), e.g. the code before a change and after.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

BARE = """
import time
wall, cpu = time.perf_counter(), time.process_time()
import torch, transformers
print(time.perf_counter() - wall, time.process_time() - cpu)
"""
FIRST_USE = """
import sys, time
import torch, transformers
wall, cpu = time.perf_counter(), time.process_time()
import weightplan
weightplan.explain
print(time.perf_counter() - wall, time.process_time() - cpu,
      sum(m.split(".")[0] == "weightplan" for m in sys.modules))
"""
LOAD_PATH = """
import importlib, sys, time
import torch, transformers
wall, cpu = time.perf_counter(), time.process_time()
import weightplan
weightplan.explain
for name in sys.argv[1:]:  # then what explain, print and execute import
    importlib.import_module(name)
print(time.perf_counter() - wall, time.process_time() - cpu)
"""
# the demo's load, in a fresh process: the weightplan modules after weightplan.explain is
# first looked up, and after explain + print + execute (in the order they were imported)
PROBE = """
import contextlib, io, json, sys
import torch
import weightplan
weightplan.explain
first = [m for m in sys.modules if m.split(".")[0] == "weightplan"]
from weightplan.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["demo"]) == 0
load = [m for m in sys.modules if m.split(".")[0] == "weightplan"]
print(json.dumps({"first": first, "load": load, "rich": "rich" in sys.modules}))
"""
# what a plain load should not import (tests/test_import_scope.py checks the same and more)
NOT_FOR_A_LOAD = ("api.convert", "api.model_config", "api.pretrained", "api.write_plans",
                  "planner.pipelines.save", "planner.pipelines.write_plan",
                  "planner.pipelines.convert", "planner.write.shards",
                  "planner.write.reverse", "executor.execute_write", "executor.writer",
                  "planner.inputs.parallel_plan", "planner.core.sharding.styles", "bridge",
                  "viz.dot", "viz.boxes", "viz.groups",
                  # a feature the demo's input doesn't have: quantized formats, adapters, TP
                  "planner.inputs.quant_", "planner.inputs.fp8_", "planner.inputs.packed_",
                  "planner.inputs.adapter", "planner.tensors.ir.quant_",
                  "planner.tensors.ir.packed_", "planner.tensors.ir.shard_nodes",
                  "planner.core.sharding.config", "executor.dtensors", "executor.strided_read",
                  "planner.pipelines.cooperative", "planner.pipelines.fp8_findings")


def run(root: Path, code: str, *args: str) -> str:
    """``python -c code args`` in a fresh process importing weightplan from ``root``."""
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, cwd=root, check=False)
    if done.returncode != 0:
        raise SystemExit(f"a probe failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def timed(root: Path, code: str, *args: str) -> tuple[float, float]:
    """The wall and CPU seconds a probe prints first."""
    out = run(root, code, *args).split()
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--root", type=Path, action="append",
                        help="a checkout whose weightplan is measured (default: this one); "
                             "give several to measure them side by side, interleaved")
    args = parser.parse_args()
    roots = [r.resolve() for r in args.root or [HERE.parent]]
    loads: dict[Path, list[str]] = {}
    probes: dict[Path, dict] = {}
    for root in roots:
        if not compileall.compile_dir(str(root / "weightplan"), quiet=1):
            raise SystemExit(f"could not compile {root / 'weightplan'}")
        probes[root] = json.loads(run(root, PROBE).splitlines()[-1])
        loads[root] = [m for m in probes[root]["load"]
                       if m not in ("weightplan.cli", "weightplan.demo")]
    bare: list[tuple[float, float]] = []
    times: dict[tuple[Path, str], list[tuple[float, float]]] = {
        (root, key): [] for root in roots for key in ("first", "load")}
    for _ in range(args.repeat):  # interleaved, so that a busy minute touches them all
        bare.append(timed(roots[0], BARE))
        for root in roots:
            times[root, "first"].append(timed(root, FIRST_USE))
            times[root, "load"].append(timed(root, LOAD_PATH, *loads[root]))
    print(f"weightplan imports (fresh processes, medians of {args.repeat}; wall / CPU)")
    _row("import torch, transformers (the reference)", bare)
    for root in roots:
        print(f"{root}:")
        _row("  weightplan.explain, first use", times[root, "first"], "   (target: ≤ 50 ms)")
        _row("  a plain load's weightplan modules", times[root, "load"])
        unneeded = [m for m in loads[root]
                    if m.removeprefix("weightplan.").startswith(NOT_FOR_A_LOAD)]
        unneeded += ["rich (no bar drawn)"] if probes[root]["rich"] else []
        print(f"    weightplan modules after the first use: {len(probes[root]['first'])}; "
              f"after the demo's load: {len(probes[root]['load'])} "
              "(the files its code runs: benchmarks/walks.py)")
        print(f"    of those, not needed by a plain load: {', '.join(unneeded) or 'none'}")


def _row(label: str, runs: list[tuple[float, float]], target: str = "") -> None:
    wall = statistics.median(t[0] for t in runs)
    cpu = statistics.median(t[1] for t in runs)
    print(f"  {label:<46}{1000 * wall:>8.1f} ms / {1000 * cpu:.1f} ms{target}")


if __name__ == "__main__":
    main()
