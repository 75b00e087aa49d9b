"""The ``weightplan`` command line.

    weightplan demo                                  build, explain and load a small checkpoint
    weightplan explain CKPT_DIR                      the full plan for the model config.json names
    weightplan explain CKPT --model-type mixtral     what the keys become, with shapes (no model)
    weightplan explain CKPT --model-type mixtral --json
    weightplan mappings                              registered mappings and aliases
"""

from __future__ import annotations

import argparse
import json
import sys

from weightplan.errors import WeightplanError


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
    exp.add_argument("--json", action="store_true", help="print plan.to_dict() as JSON")
    exp.add_argument("--width", type=int, default=None, help="text width")
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
        from weightplan.planner.registry import REGISTRY

        for key in REGISTRY.keys():
            target = REGISTRY.resolve(key)
            print(key if target == key else f"{key} -> {target}")
        return 0
    return _explain(args)


def _explain(args: argparse.Namespace) -> int:
    import weightplan
    from weightplan.viz.text import explain_text

    model, dtype = None, args.dtype
    if args.mapping is None:
        model, dtype = _model_for(args.checkpoint, args.dtype)
    plan = weightplan.explain(model, args.checkpoint, mapping=args.mapping, dtype=dtype)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        sys.stdout.write(explain_text(plan, width=args.width))
    return 0


def _model_for(checkpoint: str, dtype: str | None):
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
