"""Planning benchmark: ``explain()`` at frontier scale, per phase, and its scaling in keys.

Uses the header-only fixtures of :mod:`benchmarks.frontier` (sparse files, written once
under ``--cache``) and the model each ``config.json`` names, built by transformers on
``meta``. For every checkpoint it prints the median ``explain()`` time, its split by
pipeline phase, the Python heap the plan holds per key (tracemalloc, a separate run), and
how long ``str(plan)``, ``plan.to_dict()`` and the DOT text behind ``plan.render()`` take.
``--scaling`` explains DeepSeek-V3 FP8 cut to a few layer counts (≈10k → 92k keys) and
prints µs per key, which stays flat when planning is linear in keys.

    python benchmarks/plan.py [--only deepseek-v3-fp8] [--repeat 3] [--scaling]

Targets (issue 14): DeepSeek-V3 FP8 (91,991 keys) in ≤ 1.0 s, ≤ 1 KB per key,
``print``/``to_dict``/``render`` ≤ 0.5 s each. Figures from a shared, loaded machine
vary a lot from minute to minute, so times are the process's CPU time (wall time is
printed too): explain is single-threaded, and CPU time is what another process stealing
the cores doesn't inflate.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.frontier import FIXTURES, fixture_keys, write_fixture  # noqa: E402

# (module, function) pairs explain() calls, each timed on its own (lower's parts inside it)
PHASES = (("weightplan.planner.explain", "open_checkpoint"),
          ("weightplan.planner.explain", "inspect_model"),
          ("weightplan.planner.explain", "choose_mapping"),
          ("weightplan.planner.explain", "quant_context"),
          ("weightplan.planner.explain", "route_checkpoint"),
          ("weightplan.planner.explain", "build_conversions"),
          ("weightplan.planner.explain", "add_scale_conversions"),
          ("weightplan.planner.tensors.lower", "plan_graph"),
          ("weightplan.planner.tensors.lower", "plan_step"),
          ("weightplan.planner.tensors.lower", "verify"),
          ("weightplan.planner.tensors.lower", "schedule_within"),
          ("weightplan.planner.explain", "collect_findings"),
          ("weightplan.planner.explain", "with_fp8_findings"))


def fixture(cache: Path, name: str, layers: int | None = None) -> Path:
    directory = cache / (name if layers is None else f"{name}-{layers}l")
    if not (directory / "config.json").exists():
        write_fixture(name, directory, layers)
    return directory


def meta_model(directory: Path):
    """The config's model on meta (parameters and buffers: nothing is allocated)."""
    import transformers

    import weightplan

    config = transformers.AutoConfig.from_pretrained(directory)
    with weightplan.init_empty(include_buffers=True):
        return getattr(transformers, config.architectures[0])(config)


class PhaseTimer:
    """Wraps the pipeline functions ``explain`` calls and sums the time spent in each."""

    def __init__(self):
        import importlib

        self.seconds, self.saved = {}, []
        for module_name, name in PHASES:
            module = importlib.import_module(module_name)
            fn = getattr(module, name)
            self.saved.append((module, name, fn))
            setattr(module, name, self._timed(name, fn))

    def _timed(self, name, fn):
        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.process_time() - start
        return timed

    def close(self) -> None:
        for module, name, fn in self.saved:
            setattr(module, name, fn)


def measure(directory: Path, repeat: int) -> dict:
    import torch

    import weightplan

    model = meta_model(directory)
    runs, cpu, phases = [], [], []
    for _ in range(repeat):
        plan = None  # the previous run's plan is freed here, not inside the next timing
        timer = PhaseTimer()
        gc.collect()
        start, start_cpu = time.perf_counter(), time.process_time()
        plan = weightplan.explain(model, directory, dtype=torch.bfloat16)
        runs.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        timer.close()
        phases.append(timer.seconds)
    result = {"keys": len(plan.checkpoint), "wall": statistics.median(runs),
              "explain": statistics.median(cpu),
              "phases": {k: statistics.median(p.get(k, 0.0) for p in phases) for _, k in PHASES}}
    result.update(presentation(plan))
    del plan
    result["heap_per_key"] = heap_per_key(model, directory)
    return result


def presentation(plan) -> dict:
    from weightplan.viz.dot import to_dot

    out = {}
    for what, call in (("print", lambda: str(plan)), ("to_dict", plan.to_dict),
                       ("render (DOT)", lambda: to_dot(plan))):
        start = time.process_time()
        call()
        out[what] = time.process_time() - start
    return out


def heap_per_key(model, directory: Path) -> float:
    import torch

    import weightplan

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    plan = weightplan.explain(model, directory, dtype=torch.bfloat16)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / len(plan.checkpoint)


def report(name: str, r: dict) -> None:
    print(f"\n{name}: {r['keys']:,} keys — explain {r['explain']:.3f} s of CPU "
          f"({r['wall']:.3f} s wall; medians), {r['heap_per_key']:.0f} B of Python heap per key")
    rest = r["explain"] - sum(r["phases"].values())
    for phase, seconds in (*r["phases"].items(), ("(the rest)", rest)):
        print(f"  {phase:<22}{seconds:>8.3f} s  {100 * seconds / r['explain']:>5.1f}%")
    print("  " + ", ".join(f"{k} {r[k]:.3f} s" for k in ("print", "to_dict", "render (DOT)")))


def scaling(cache: Path, repeat: int) -> None:
    print("\nscaling (DeepSeek-V3 FP8 cut to N layers):")
    print(f"{'layers':>7}{'keys':>9}{'explain s':>11}{'µs / key':>10}")
    for layers in (6, 12, 30, 61):
        r = measure(fixture(cache, "deepseek-v3-fp8", layers), repeat)
        print(f"{layers:>7}{r['keys']:>9,}{r['explain']:>11.3f}"
              f"{1e6 * r['explain'] / r['keys']:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=HERE / ".cache" / "frontier")
    parser.add_argument("--only", choices=sorted(FIXTURES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scaling", action="store_true")
    args = parser.parse_args()
    print("explain() on header-only frontier fixtures, model on meta (shared machine: "
          "figures are noisy)")
    for name in [args.only] if args.only else FIXTURES:
        directory = fixture(args.cache, name)
        assert len(fixture_keys(name)) > 0
        report(name, measure(directory, args.repeat))
    if args.scaling:
        scaling(args.cache, args.repeat)


if __name__ == "__main__":
    main()
