"""The ``weightplan`` command line: runs the commands :mod:`weightplan.cli_parser` reads
(its docstring is the usage text and the exit statuses ``--help`` prints)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, NoReturn

from weightplan.cli_parser import build_parser
from weightplan.cli_status import (CLOSED, INTERRUPTED, OK, PROBLEMS, TERMINATED,
                                   error_status)
from weightplan.cli_words import cli_wording
from weightplan.errors import WeightplanError

if TYPE_CHECKING:
    from torch import nn

    from weightplan.api.plans import Plan


# commands that only read and print: run as the program (not called by a caller), they run
# without the cyclic garbage collector and leave without the interpreter's teardown
READ_ONLY = ("explain", "mappings")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    program = argv is None and args.command in READ_ONLY
    if program:
        # one short pass that frees what it drops by reference counting: the collector would
        # only re-walk torch's, transformers' and the plan's objects (about 0.5 s while
        # transformers imports a frontier model's modules) to find next to nothing (peak RSS
        # +8 MB without it on DeepSeek-V3)
        gc.disable()
    code = _run(args)
    if program:
        _exit_now(code)
    return code


def _exit_now(code: int) -> NoReturn:
    """Flush and leave at once. The interpreter's teardown would free every object of
    torch, transformers, the model and the plan one by one, with full garbage collections
    on the way: about a second for a frontier plan, after the answer is printed. Nothing
    is left to do by then (a read-only command holds no open file, thread or temp dir)."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # a closed pipe: as Python's own exit reports it
        code = code or CLOSED
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


class _Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a CI runner's cancel), raised in the main thread as
    Ctrl-C is: a save or convert removes its temporaries and its lock on the way out."""


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    raise _Terminated


def _run(args: argparse.Namespace) -> int:
    previous = None
    # (SIGTERM ignored by the parent, nohup-like, stays ignored: as Python leaves SIGINT)
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _dispatch(args)
    except KeyboardInterrupt as e:
        how = " (SIGTERM)" if isinstance(e, _Terminated) else ""
        print(f"weightplan: interrupted{how}", file=sys.stderr)
        return TERMINATED if isinstance(e, _Terminated) else INTERRUPTED
    except BrokenPipeError:  # the reader left (``| head``): nothing is wrong, stop quietly
        _drop_stdout()
        return CLOSED
    except Exception as e:  # one line, whatever it is; --debug shows the traceback
        if args.debug:
            import traceback

            traceback.print_exc()
        kind = type(e).__name__
        if not isinstance(e, WeightplanError):
            kind = f"unexpected {kind}"
        message = cli_wording(" ".join(str(e).split()))
        print(f"weightplan: error: {kind}: {_safe(message)}", file=sys.stderr)
        return error_status(e)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _safe(text: str) -> str:
    """``text`` with control and bidi characters escaped, line by line
    (:func:`weightplan.viz.style.terminal_lines`); imported only for text that needs it."""
    if text.replace("\n", "").isprintable():
        return text
    from weightplan.viz.style import terminal_lines

    return terminal_lines(text)


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the flush at exit doesn't fail on the closed pipe
    a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind stdout (captured): nothing to do
        pass


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from weightplan.demo import run_demo

        return run_demo(args.dir)
    if args.command == "mappings":
        return _mappings(args)
    if args.command == "convert":
        return _convert(args)
    if args.command == "recover":
        from weightplan.executor.commit import recover

        print(_safe(recover(args.directory)))
        return OK
    return _explain(args)


def _status(problems: object, args: argparse.Namespace) -> int:
    """``PROBLEMS`` when the plan has problems (unless ``--allow-problems``), else ``OK``."""
    if problems and not args.allow_problems:
        print("weightplan: the plan has problems (exit status 1; --allow-problems exits 0)",
              file=sys.stderr)
        return PROBLEMS
    return OK


def _mappings(args: argparse.Namespace) -> int:
    from weightplan.bridge.names import bridged_names
    from weightplan.planner.keys.mappings import REGISTRY

    rows = []
    for key in REGISTRY.keys():
        target = REGISTRY.resolve(key)
        rows.append({"name": key, "alias_of": None if target == key else target,
                     "source": "registry"})
    rows += [{"name": key, "alias_of": None, "source": "transformers bridge"}
             for key in bridged_names() if key not in REGISTRY]
    if args.json:
        print(json.dumps(rows, indent=2))
        return OK
    for row in rows:
        alias = f" -> {row['alias_of']}" if row["alias_of"] else ""
        bridged = " (transformers bridge)" if row["source"] != "registry" else ""
        print(_safe(f"{row['name']}{alias}{bridged}"))
    return OK


def _convert(args: argparse.Namespace) -> int:
    import weightplan

    plan = weightplan.explain_convert(args.source, args.destination, mapping=args.mapping,
                                      reverse=args.reverse, max_shard_size=args.max_shard_size,
                                      overwrite=args.overwrite, threads=args.threads,
                                      dequantize=args.dequantize, to=args.to,
                                      budget=args.budget, variant=args.variant)
    print(plan)
    if not args.dry_run:
        print(_safe(str(plan.execute())))
    return OK


def _explain(args: argparse.Namespace) -> int:
    import weightplan
    from weightplan.viz.text import explain_text

    from weightplan.api.hub import resolve_checkpoint

    _check_flags(args)  # (--base: the checkpoint is an adapter, --variant picks the base's files)
    args.checkpoint = str(resolve_checkpoint(args.checkpoint, variant=None if args.base else args.variant))
    model, dtype, note = None, args.dtype, None  # (a repo id: its snapshot)
    if args.base is not None or _adapter_dir(args.checkpoint):
        from weightplan.api.adapters import explain_adapter_dir

        plan = explain_adapter_dir(args.checkpoint, args.base, dtype=dtype or "auto", variant=args.variant,
                                   budget=args.budget, tp=args.tp, merge=args.merge)
    else:
        if args.merge:
            from weightplan.errors import ArgumentError

            raise ArgumentError(f"--merge merges an adapter: {args.checkpoint} is not an "
                                "adapter directory (adapter_config.json); give one, with "
                                "--base BASE_DIR")
        if args.mapping is None:
            model, dtype, note = _model_for(args.checkpoint, args.dtype, args.dequantize)
        if args.tp is not None:
            code = _explain_ranks(model, dtype, args)
            if note is not None:
                print(_safe(note), file=sys.stderr)
            return code
        plan = weightplan.explain(model, _variant_read(args), mapping=args.mapping, dtype=dtype,
                                  budget=args.budget, device_map=args.device_map,
                                  max_memory=args.max_memory,
                                  offload_folder=args.offload_folder,
                                  dequantize_on=args.dequantize_on)
        if args.dequantize:  # (a checkpoint with nothing quantized: said as convert says it)
            from weightplan.planner.pipelines.dequantize import nothing_quantized

            said = nothing_quantized(_variant_read(args))
            note = "\n".join(filter(None, (note, said and f"weightplan: {said}"))) or None
    if note is not None:  # (after the plan: an error is the one line on stderr)
        print(_safe(note), file=sys.stderr)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        sys.stdout.write(explain_text(plan, width=args.width, wording=cli_wording))
    _pictures(plan, args)
    return _status(plan.problems, args)


def _adapter_dir(checkpoint: str) -> bool:
    """Whether ``checkpoint`` is explained as an adapter onto its base, as from_pretrained
    loads it (a model beside it, without peft: the model alone, with a warning)."""
    if not os.path.isfile(f"{checkpoint}/adapter_config.json"):
        return False
    from pathlib import Path

    from weightplan.api.adapters import loads_adapter

    return loads_adapter(Path(checkpoint))


def _variant_read(args: argparse.Namespace) -> Any:
    """The checkpoint: its path, or with ``--variant`` the directory read for its files (or
    holding an adapter not loaded: the model's files)."""
    if args.variant is None and not os.path.isfile(f"{args.checkpoint}/adapter_config.json"):
        return args.checkpoint
    from weightplan.bridge.config_guard import read_directory

    return read_directory(args.checkpoint, args.variant)


def _check_flags(args: argparse.Namespace) -> None:
    """``explain``'s flags that only mean something beside another one: given alone they
    would be ignored, so they are refused, naming the flag they need.

    Raises:
        ArgumentError: a flag given without the one it needs, or two that exclude each other.
    """
    from weightplan.errors import ArgumentError

    needs = [("--ep", args.ep, "--tp"), ("--cooperative", args.cooperative, "--tp"),
             ("--nodes", args.nodes is not None, "--tp N --cooperative"),
             ("--storage node", args.storage != "shared", "--tp N --cooperative"),
             ("--tp-plan", args.tp_plan is not None, "--tp"),
             ("--max-memory", args.max_memory is not None, "--device-map"),
             ("--offload-folder", args.offload_folder is not None, "--device-map"),
             ("--only", args.only is not None, "--svg"),
             ("--detail", args.detail is not None, "--svg"),
             ("--fold/--no-fold", args.fold is not None, "--svg")]
    present = {"--tp": args.tp is not None, "--device-map": args.device_map is not None,
               "--svg": bool(args.svg),
               "--tp N --cooperative": args.tp is not None and args.cooperative}
    for flag, given, need in needs:
        if given and not present[need]:
            raise ArgumentError(f"{flag} needs {need} (e.g. {_example(need)})")
    if args.tp is not None and args.device_map is not None:
        raise ArgumentError("--tp and --device-map exclude each other: each rank's part goes "
                            "to its own device (as transformers' tp_plan and device_map)")
    if args.tp is not None and (args.svg or args.timeline):
        raise ArgumentError("--svg and --timeline draw one plan: drop --tp to draw it")
    if args.svg:  # (a path no picture is drawn as: said before the plan, not after it)
        from weightplan.viz.dot import picture_format

        picture_format(args.svg)
    if args.timeline:
        from weightplan.viz.timeline import timeline_path

        timeline_path(args.timeline)


def _example(flag: str) -> str:
    return {"--tp": "--tp 8", "--device-map": "--device-map auto", "--svg": "--svg plan.svg",
            "--tp N --cooperative": "--tp 8 --cooperative --nodes 2 --storage node"}[flag]


def _explain_ranks(model: Any, dtype: Any, args: argparse.Namespace) -> int:
    """``--tp N [--ep]``: every rank planned in this process; a table, or JSON rows."""
    from weightplan.errors import ParallelError
    from weightplan.planner.core.sharding.config import TensorParallel, per_node
    from weightplan.planner.core.problems import Problem, ProblemKind
    from weightplan.planner.pipelines.ranks import plan_ranks, rank_rows
    from weightplan.viz.ranks import rank_table

    if model is None:
        raise ParallelError("--tp needs the model: a checkpoint directory with config.json "
                            "and transformers installed")
    tp = TensorParallel(plan=_tp_plan(args.tp_plan), world_size=args.tp, rank=0,
                        experts="ep" if args.ep else "tp", output="local",
                        cooperative=args.cooperative, storage=args.storage,
                        local_world_size=per_node(args.tp, args.nodes))
    plans = plan_ranks(model, _variant_read(args), tp, mapping=args.mapping, dtype=dtype,
                       budget=args.budget, dequantize_on=args.dequantize_on)
    from weightplan.bridge.distribute import heads_problem

    cant_run = heads_problem(model, tp, args.tp)
    if args.json:
        rows = rank_rows(plans)
        if cant_run is not None:  # (every rank's: the deployment can't run)
            for row in rows:
                row["problems"].append(Problem(ProblemKind.PARALLEL, "", cant_run).to_dict())
        print(json.dumps(rows, indent=2))
    else:
        print(_safe(rank_table(plans, wording=cli_wording, width=args.width)))
    if cant_run is not None:  # planned all the same: the bytes are right, the forward isn't
        print(f"weightplan: problem: loading with tp={args.tp} is refused: {cant_run}",
              file=sys.stderr)  # (a problem for the status: the deployment can't run)
    refused = [cant_run] if cant_run is not None else []
    return _status([p for plan in plans for p in plan.problems] + refused, args)


def _tp_plan(text: str | None) -> Any:
    """``--tp-plan``: ``"auto"`` without it; a JSON object given inline or as ``@FILE``."""
    from pathlib import Path

    from weightplan.errors import ArgumentError

    if text is None:
        return "auto"
    try:
        raw = Path(text[1:]).read_text() if text.startswith("@") else text
        plan = json.loads(raw)
    except (OSError, ValueError) as e:
        raise ArgumentError(f"--tp-plan {text!r}: not a JSON object {{module glob: style}} "
                            f"({e})") from e
    if not isinstance(plan, dict) or not all(isinstance(v, str) for v in plan.values()):
        raise ArgumentError(f"--tp-plan {text!r}: give a JSON object {{module glob: style}} "
                            "with style names as strings")
    return plan


def _pictures(plan: Plan, args: argparse.Namespace) -> None:
    """``--svg`` / ``--timeline``: write the pictures; say where on stderr (stdout may be JSON)."""
    import warnings

    from weightplan.terminal import terminal_text  # one line each: a name's \n escaped

    if args.svg:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            written = plan.render(args.svg, detail=args.detail, only=args.only, fold=args.fold)
        for w in caught:
            print(terminal_text(f"weightplan: {w.message}"), file=sys.stderr)
        print(terminal_text(f"weightplan: wrote {written}"), file=sys.stderr)
    if args.timeline:
        written = plan.render_timeline(args.timeline)
        print(terminal_text(f"weightplan: wrote {written}"), file=sys.stderr)


def _model_for(checkpoint: str, dtype: str | None, dequantize: bool = False
               ) -> tuple[nn.Module | None, Any, str | None]:
    """The model config.json names, built on meta (holding a quantized checkpoint's format
    unless ``--dequantize`` or ``--dtype`` asks for a dequantized model), the dtype, and a
    note for stderr; ``None`` and the note saying why when there is no config.json or no
    transformers (then the keys are explained as they are)."""
    from weightplan.bridge.hub import build_empty_model, config_path

    if config_path(checkpoint) is None:
        return None, dtype, (f"weightplan: no config.json next to {checkpoint}: explained the "
                             "keys without a model (pass --model-type to apply a mapping)")
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None, dtype, ("weightplan: transformers is not installed: explained the keys "
                             "without a model")
    from weightplan.api.status import status

    with status(f"building the model {config_path(checkpoint)} names (on meta)",
                "built the model", None):
        built = build_empty_model(checkpoint, keep_quantized=not dequantize
                                  and dtype in (None, "auto"))
    note = None if built.note is None else f"weightplan: {built.note}"
    return built.model, dtype if dtype is not None else "auto", note


if __name__ == "__main__":
    sys.exit(main())
