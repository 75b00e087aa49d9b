"""The ``weightplan`` command line.

    weightplan demo                                  build, explain and load a small checkpoint
    weightplan explain CKPT_DIR                      the full plan for the model config.json names
    weightplan explain CKPT --model-type mixtral     what the keys become, with shapes (no model)
    weightplan explain CKPT --model-type mixtral --json
    weightplan explain CKPT --model-type mixtral --svg plan.svg --timeline mem.svg
    weightplan convert SRC DST --model-type mixtral [--reverse]   on disk, no model
    weightplan mappings                              registered mappings and aliases
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from weightplan.errors import WeightplanError

if TYPE_CHECKING:
    from torch import nn

    from weightplan.api.plans import Plan


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="weightplan", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="build a small legacy checkpoint, explain and load it")
    demo.add_argument("--dir", help="write the demo checkpoint here (default: a temp dir)")
    exp = sub.add_parser("explain", help="explain loading a checkpoint (headers only)")
    exp.add_argument("checkpoint", help=".safetensors file or checkpoint directory; with a "
                     "config.json and transformers installed, the model it names is built "
                     "on meta and the full plan explained")
    exp.add_argument("--model-type", "--mapping", dest="mapping",
                     help="explain without a model, under this registered mapping "
                          "(model_type or class name), e.g. mixtral")
    exp.add_argument("--dtype", help="cast floating tensors to this dtype (e.g. bf16)")
    exp.add_argument("--budget", help="memory the load may add at most, e.g. 8GiB")
    exp.add_argument("--json", action="store_true", help="print plan.to_dict() as JSON")
    exp.add_argument("--width", type=int, default=None, help="text width")
    exp.add_argument("--svg", metavar="PATH",
                     help="draw the plan graph (.svg/.png/.pdf with graphviz, or .dot)")
    exp.add_argument("--timeline", metavar="PATH", help="draw the memory timeline (.svg)")
    exp.add_argument("--detail", choices=("grouped", "full"), default=None,
                     help="graph detail (default: grouped; full with --only)")
    exp.add_argument("--only", metavar="GLOB",
                     help="draw only the keys matching GLOB, e.g. 'model.layers.0.*'")
    conv = sub.add_parser("convert", help="convert a checkpoint on disk to another layout")
    conv.add_argument("source", help="checkpoint file or directory")
    conv.add_argument("destination", help="output directory")
    conv.add_argument("--model-type", "--mapping", dest="mapping", required=True,
                      help="registered mapping, e.g. mixtral")
    conv.add_argument("--reverse", action="store_true",
                      help="apply the inverse mapping (model layout back to the original)")
    conv.add_argument("--max-shard-size", default="5GB", help="bytes per output shard")
    conv.add_argument("--overwrite", action="store_true", help="replace a checkpoint in DST")
    conv.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    conv.add_argument("--threads", type=int, default=4)
    sub.add_parser("mappings", help="list registered mappings")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except WeightplanError as e:
        print(f"weightplan: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from weightplan.demo import run_demo

        return run_demo(args.dir)
    if args.command == "mappings":
        from weightplan.planner.keys.registry import REGISTRY

        for key in REGISTRY.keys():
            target = REGISTRY.resolve(key)
            print(key if target == key else f"{key} -> {target}")
        return 0
    if args.command == "convert":
        return _convert(args)
    return _explain(args)


def _convert(args: argparse.Namespace) -> int:
    import weightplan

    plan = weightplan.explain_convert(args.source, args.destination, mapping=args.mapping,
                                      reverse=args.reverse, max_shard_size=args.max_shard_size,
                                      overwrite=args.overwrite, threads=args.threads)
    print(plan)
    if not args.dry_run:
        print(plan.execute())
    return 0


def _explain(args: argparse.Namespace) -> int:
    import weightplan
    from weightplan.viz.text import explain_text

    model, dtype = None, args.dtype
    if args.mapping is None:
        model, dtype = _model_for(args.checkpoint, args.dtype)
    plan = weightplan.explain(model, args.checkpoint, mapping=args.mapping, dtype=dtype,
                              budget=args.budget)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        sys.stdout.write(explain_text(plan, width=args.width))
    _pictures(plan, args)
    return 0


def _pictures(plan: Plan, args: argparse.Namespace) -> None:
    """``--svg`` / ``--timeline``: write the pictures; say where on stderr (stdout may be JSON)."""
    import warnings

    if args.svg:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            written = plan.render(args.svg, detail=args.detail, only=args.only)
        for w in caught:
            print(f"weightplan: {w.message}", file=sys.stderr)
        print(f"weightplan: wrote {written}", file=sys.stderr)
    if args.timeline:
        print(f"weightplan: wrote {plan.render_timeline(args.timeline)}", file=sys.stderr)


def _model_for(checkpoint: str, dtype: str | None) -> tuple[nn.Module | None, Any]:
    """The model config.json names, built on meta; ``None`` when there is no config.json
    or no transformers (then the keys are explained as they are)."""
    from weightplan.bridge.hub import build_empty_model, config_path

    if config_path(checkpoint) is None:
        print(f"weightplan: no config.json next to {checkpoint}: explaining the keys without a "
              "model (pass --model-type to apply a mapping)", file=sys.stderr)
        return None, dtype
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("weightplan: transformers is not installed: explaining the keys without a model",
              file=sys.stderr)
        return None, dtype
    built = build_empty_model(checkpoint)
    return built.model, dtype if dtype is not None else built.dtype


if __name__ == "__main__":
    sys.exit(main())
