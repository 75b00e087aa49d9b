"""The ``weightplan`` command line's arguments (:mod:`weightplan.cli` runs them).

    weightplan demo                                  build, explain and load a small checkpoint
    weightplan explain CKPT_DIR                      the full plan for the model config.json names
    weightplan explain ORG/NAME                      the same for a Hugging Face repo id
    weightplan explain CKPT --model-type mixtral     what the keys become, with shapes (no model)
    weightplan explain CKPT --model-type mixtral --json
    weightplan explain CKPT --model-type mixtral --svg plan.svg --timeline mem.svg
    weightplan explain CKPT_DIR --dequantize         a quantized checkpoint planned dequantized
    weightplan explain ADAPTER_DIR [--base BASE_DIR] a LoRA adapter with its base, one plan
    weightplan explain CKPT_DIR --device-map auto --max-memory cuda:0=80GiB,cpu=200GiB
                                                  [--offload-folder DIR]  per-device peaks
    weightplan explain CKPT_DIR --device-map '{"model": "cuda:0", "lm_head": "disk"}'
                                                  a map as given (or @FILE.json; a device)
    weightplan explain CKPT_DIR --tp 8 [--ep] [--cooperative] [--nodes 2 --storage node]
                                                  every rank's storage / network / held / peak
    weightplan convert SRC DST [--reverse]           on disk, no model (mapping: config.json's
                                                     model_type, or --model-type)
    weightplan convert SRC DST --dequantize | --to fp8   quantized weights to bf16, or
                                                     MXFP4 re-encoded as block FP8 (lossless)
                                                     [--budget 2GiB: within that memory]
    weightplan mappings [--json]                     registered mappings and aliases
    weightplan recover DIR                           complete a save interrupted in its commit

exit status:
    0    done; the plan has no problems
    1    the plan has problems (missing or unexpected keys, shape mismatches, tensor-parallel
         problems): printed, nothing loaded; --allow-problems exits 0 anyway
    2    bad arguments (an unknown flag or value, a flag without the one it needs)
    3    the checkpoint can't be read (no such path nor Hub repo, not safetensors, a corrupt
         or truncated header, a missing shard)
    4    the directory holds an interrupted save: run weightplan recover DIR
    5    any other error (the plan can't be made or run as asked: mapping, model, budget,
         a failed save or convert)
    6    an unexpected error (a bug: please report it with --debug's traceback)
    7    another save or recover holds the directory's lock: run it again once it is done
         (2 to 7: one line on stderr naming the error; --debug adds the traceback)
    120  stdout was closed early (| head)
    130  interrupted (Ctrl-C)
    143  terminated (SIGTERM); like 130, a convert's temporaries are removed first

Keys, paths and messages are printed with control and bidi characters escaped.
"""

from __future__ import annotations

import argparse
import difflib
import json
from pathlib import Path
from typing import Any, NoReturn

from weightplan import __version__


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument said in one line (and where to read more) instead of
    the whole usage block; an argument the command doesn't take is said by the command
    (``weightplan convert: error: …``), with the flags it is close to, or the commands
    whose flag it is."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            commands = _commands(self)
            command = commands.get(str(getattr(parsed, "command", "")), self)
            message = f"unrecognized arguments: {' '.join(extras)}"
            command.error(message + _close_flags(command, extras, commands))
        return parsed

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: p for a in parser._actions if isinstance(a, argparse._SubParsersAction)
            for name, p in a.choices.items()}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def _close_flags(command: argparse.ArgumentParser, extras: list[str],
                 commands: dict[str, argparse.ArgumentParser]) -> str:
    """For a mistyped flag, the command's flags it is close to (``; did you mean --tp?``);
    for another command's flag, which commands take it; for the command's own flag (given
    before the command), where it goes."""
    own, name = _flags(command), command.prog.split()[-1]
    words = [w.split("=")[0] for w in extras if w.startswith("-")]
    early = [w for w in words if w in own]  # (``weightplan --json explain DIR``)
    owners = {w: [n for n, p in commands.items() if p is not command and w in _flags(p)]
              for w in words if w not in own}
    elsewhere = [f"{w} is an option of weightplan {' and '.join(names)}" if i == 0 else
                 f"{w} of weightplan {' and '.join(names)}"
                 for i, (w, names) in enumerate((w, n) for w, n in owners.items() if n)]
    close = dict.fromkeys(m for w, names in owners.items() if not names
                          for m in difflib.get_close_matches(w, sorted(own), n=2, cutoff=0.7))
    said = "".join(f"; {w} goes after the command (weightplan {name} ... {w})" for w in early)
    said += f"; did you mean {' or '.join(close)}?" if close else ""
    if elsewhere:
        said += f"; {', '.join(elsewhere)}, not of {name}"
    return said


def build_parser() -> argparse.ArgumentParser:
    lines = __doc__.splitlines()
    parser = _Parser(
        prog="weightplan", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Load model checkpoints by an explicit plan: explain a load, convert a "
                    "checkpoint on disk, list the mappings, recover an interrupted save, run "
                    "the demo.", epilog="examples:\n" + "\n".join(lines[2:]).rstrip())
    parser.add_argument("--version", action="version", version=f"weightplan {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks on errors")
    demo = sub.add_parser("demo", parents=[common],
                          help="build a small legacy checkpoint, explain and load it")
    demo.add_argument("--dir", help="write the demo checkpoint here (default: a temp dir)")
    _explain_parser(sub.add_parser("explain", parents=[common],
                                   help="explain loading a checkpoint (headers only)"))
    _convert_parser(sub.add_parser("convert", parents=[common],
                                   help="convert a checkpoint on disk to another layout"))
    mappings = sub.add_parser("mappings", parents=[common], help="list registered mappings")
    mappings.add_argument("--json", action="store_true",
                          help="print them as JSON: name, alias_of, source")
    rec = sub.add_parser("recover", parents=[common],
                         help="complete a save that was interrupted in its commit")
    rec.add_argument("directory", help="the checkpoint directory the save was writing")
    return parser


def _explain_parser(exp: argparse.ArgumentParser) -> None:
    exp.add_argument("checkpoint", help=".safetensors file, checkpoint directory or Hub repo "
                     "id (org/name, local cache first); with a "
                     "config.json and transformers installed, the model it names is built "
                     "on meta and the full plan explained")
    exp.add_argument("--model-type", "--mapping", dest="mapping",
                     help="explain without a model, under this registered mapping "
                          "(model_type or class name), e.g. mixtral")
    exp.add_argument("--dtype", help="cast floating tensors to this dtype (e.g. bf16); "
                     "'auto' (the default with a model): the config's, else the checkpoint's")
    exp.add_argument("--dequantize", action="store_true",
                     help="plan a quantized checkpoint (block FP8) dequantized into a model of "
                          "the config's dtype (also when --dtype names one); without it, the "
                          "model keeps the quantized weights and their scales, as serving does")
    exp.add_argument("--dequantize-on", choices=("auto", "host", "device"), default="auto",
                     help="where FP8 dequantizes run: on the destination device after the "
                          "copy (FP8 bytes + scales over the bus), or on the host before it; "
                          "auto (default): on the device when it is a GPU")
    exp.add_argument("--budget", type=_size("--budget"), help="memory the load may add at most, e.g. 8GiB")
    exp.add_argument("--variant", help="the weight variant's files (fp16: model.fp16."
                     "safetensors, or the shards model.safetensors.index.fp16.json names), "
                     "as transformers' from_pretrained(variant=...); with an adapter: its "
                     "base's")
    exp.add_argument("--json", action="store_true", help="print plan.to_dict() as JSON")
    exp.add_argument("--width", type=int, default=None, help="text width")
    exp.add_argument("--svg", metavar="PATH", type=_picture_path,
                     help="draw the plan graph (.svg/.png/.pdf with graphviz, or .dot)")
    exp.add_argument("--timeline", metavar="PATH", type=_picture_path, help="draw the memory timeline (.svg)")
    exp.add_argument("--detail", choices=("grouped", "full"), default=None,
                     help="graph detail (default: grouped; full with --only)")
    exp.add_argument("--fold", action=argparse.BooleanOptionalAction, default=None,
                     help="graph: draw the plain 1:1 copies (read and assigned under the same "
                          "name) as one counted box (default: for plans of 200+ conversions, "
                          "without --only)")
    exp.add_argument("--only", metavar="GLOB",
                     help="draw only the keys matching GLOB, e.g. 'model.layers.0.*'")
    _parallel_flags(exp)
    _device_flags(exp)
    exp.add_argument("--base", metavar="BASE_DIR", help="a LoRA adapter directory's base")
    exp.add_argument("--merge", action="store_true",
                     help="with an adapter: fold s·B·A into the base weights inside the plan "
                          "(from_pretrained(..., merge=True)): the plain base model, merged")
    exp.add_argument("--allow-problems", action="store_true",
                     help="exit 0 even when the plan has problems (default: exit 1)")


def _device_flags(exp: argparse.ArgumentParser) -> None:
    """``explain``'s placement flags: a strategy, a device or a map, and its budgets."""
    exp.add_argument("--device-map", metavar="MAP", type=_device_map,
                     help="auto, balanced, balanced_low_0 or sequential: place the modules "
                          "automatically (a per-device table: weights, staging, peak, "
                          "budget; devices this machine lacks may be named); a device (cpu, "
                          "cuda:0); or a JSON object {module prefix: device or \"disk\"} "
                          "(or @FILE.json), e.g. '{\"model\": \"cuda:0\", \"lm_head\": "
                          "\"disk\"}'")
    exp.add_argument("--max-memory", metavar="DEV=SIZE,...", type=_max_memory,
                     action=_MergeBudgets,
                     help="with --device-map: budgets, e.g. cuda:0=80GiB,cuda:1=80GiB,cpu=200GiB "
                          "(a bare number is a GPU index: 0=80GiB); may be repeated")
    exp.add_argument("--offload-folder", metavar="DIR",
                     help="with --device-map: where modules placed on the disk go")


def _parallel_flags(exp: argparse.ArgumentParser) -> None:
    """``explain``'s tensor-parallel flags: every rank planned from this process."""
    exp.add_argument("--tp", type=_ranks, metavar="N",
                     help="plan a tensor-parallel load over N ranks: one row per rank (read, "
                          "held, replicated, peak), from this process, with no GPU")
    exp.add_argument("--ep", action="store_true",
                     help="with --tp: whole experts per rank (the model's ep_plan)")
    exp.add_argument("--cooperative", action="store_true", help="with --tp: each "
                     "replicated tensor read by one rank and broadcast (storage vs network)")
    exp.add_argument("--nodes", type=_ranks, metavar="N",
                     help="with --tp and --cooperative: the ranks make N nodes (numbered "
                     "node by node) that share reads")
    exp.add_argument("--storage", choices=("shared", "node"), default="shared", help="with "
                     "--cooperative: one file system for all nodes, or a copy on each node")
    exp.add_argument("--tp-plan", metavar="JSON",
                     help="with --tp: the plan as a JSON object {module glob: style} (or "
                          "@FILE.json) instead of the model's tp_plan")


def _convert_parser(conv: argparse.ArgumentParser) -> None:
    conv.add_argument("source", help="checkpoint file or directory")
    conv.add_argument("destination", help="output directory (config.json and the generation "
                      "config are copied along)")
    conv.add_argument("--model-type", "--mapping", dest="mapping",
                      help="registered mapping, e.g. mixtral (default: the model_type "
                           "config.json names)")
    conv.add_argument("--variant", help="the weight variant's files (fp16: model.fp16."
                      "safetensors, or the shards model.safetensors.index.fp16.json names)")
    conv.add_argument("--reverse", action="store_true",
                      help="apply the inverse mapping (model layout back to the original)")
    conv.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                      type=_size("--max-shard-size"),
                      help="largest output file: bytes or a size like 200KB, 5GB, 2GiB "
                           "(default 5GB); a bigger tensor gets a file of its own")
    conv.add_argument("--overwrite", action="store_true",
                      help="replace a checkpoint (and config) in DST")
    conv.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    conv.add_argument("--dequantize", action="store_true",
                      help="write the quantized weights (FP8, MXFP4, compressed-tensors, "
                           "ModelOpt NVFP4) dequantized to bf16, keys as they are (unless "
                           "--mapping), config.json without quantization_config")
    conv.add_argument("--to", choices=("fp8",), default=None,
                      help="re-encode MXFP4 (gpt-oss) as 128×128 block FP8 with float32 "
                           "weight_scale_inv, losslessly (a block that can't be exact is an "
                           "error), keys as they are (unless --mapping)")
    conv.add_argument("--budget", type=_size("--budget"), help="memory the conversion may hold at most (reads in "
                      "flight, outputs not yet written), e.g. 2GiB; too small: an error "
                      "naming the minimum")
    conv.add_argument("--threads", type=_threads, default=4, metavar="N",
                      help="threads reading and writing tensors (default 4; 0: all in this "
                           "thread)")


def _size(flag: str) -> Any:
    """A size flag's check (``--budget lots`` is bad arguments, exit 2, said before any
    work); the text is passed on as given."""
    def checked(text: str) -> str:
        from weightplan.errors import PlanError
        from weightplan.units import parse_bytes

        try:
            parse_bytes(text, what=flag)
        except PlanError as e:
            raise argparse.ArgumentTypeError(str(e)) from e
        return text
    return checked


def _threads(text: str) -> int:
    """``--threads N``: 0 or more."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"--threads must be a non-negative int, got {text}")
    return int(text)


def _picture_path(text: str) -> str:
    """``--svg`` / ``--timeline``: a path in a directory that exists (refused before the
    plan, not after it is printed)."""
    parent = Path(text).parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: no directory {str(parent)!r} to write it "
                                         "in; create it first")
    return text


def _ranks(text: str) -> int:
    """``--tp N``: a whole number of ranks, at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give the number of ranks, 1 or more")
    return value


def _device_map(text: str) -> str | int | dict[str, str | int]:
    """``--device-map``: a strategy, one device (``cpu``, ``cuda:0``, ``0``: GPU 0), or a JSON
    object ``{module prefix: device}`` given inline or as ``@FILE.json`` (a device: a name,
    a GPU index, or ``"disk"``), each entry checked here: a bad one is named."""
    from weightplan.planner.tensors.schedule.device_plan import STRATEGIES

    if text in STRATEGIES:
        return text
    if not text.lstrip().startswith(("{", "[", '"', "@")):
        device = _device_key(text)
        _device_entry(None, device)
        return device
    try:
        raw = Path(text[1:]).read_text() if text.startswith("@") else text
        given = json.loads(raw)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"{text!r}: not a JSON object {{module prefix: "
                                         f"device}} ({e})") from e
    if not isinstance(given, dict) or not given:
        raise argparse.ArgumentTypeError(f"{text!r}: give a JSON object {{module prefix: "
                                         "device}, e.g. '{\"model.layers\": \"cuda:0\", "
                                         "\"\": \"cpu\"}'")
    for prefix, device in given.items():
        _device_entry(prefix, device)
    return given


def _device_entry(prefix: str | None, device: object) -> None:
    """One device of ``--device-map`` (``prefix``: its entry in a JSON object)."""
    import torch

    from weightplan.planner.tensors.schedule.device_plan import STRATEGIES

    where = "" if prefix is None else f"entry {json.dumps(prefix)}: "
    if device == "disk" and prefix is not None:
        return
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return  # a GPU index, as transformers takes it
    try:
        if not isinstance(device, str):
            raise ValueError("a device is a string ('cpu', 'cuda:0', 'disk') or a GPU index")
        kind = torch.device(device).type
    except (RuntimeError, ValueError) as e:  # (torch's message lists every device type)
        raise argparse.ArgumentTypeError(
            f"{where}{json.dumps(device)} is not a device; give "
            f"{', '.join(STRATEGIES)}, a device (cpu, cuda:0) or a JSON object "
            "{module prefix: device or \"disk\"}") from e
    if kind == "meta":
        raise argparse.ArgumentTypeError(f"{where}\"meta\" holds nothing: name a real device")


def _max_memory(text: str) -> dict[str | int, str]:
    """``cuda:0=80GiB,0=80GiB,cpu=200GiB`` → ``{"cuda:0": "80GiB", 0: "80GiB", "cpu":
    "200GiB"}`` (a bare number is a GPU index, as transformers' ``max_memory={0: ...}``);
    each size is read here, so that one that isn't is said as the flag's (the devices are
    read with the plan)."""
    from weightplan.errors import PlanError
    from weightplan.units import parse_bytes

    pairs = [p.partition("=") for p in text.split(",") if p.strip()]
    if not pairs or any(not sep or not k.strip() or not v.strip() for k, sep, v in pairs):
        raise argparse.ArgumentTypeError(f"expected DEVICE=SIZE[,DEVICE=SIZE...], got {text!r}")
    budgets: dict[str | int, str] = {_device_key(k.strip()): v.strip() for k, _, v in pairs}
    for key, size in budgets.items():
        try:
            parse_bytes(size, what="the size")
        except PlanError as e:
            raise argparse.ArgumentTypeError(f"{key}={size}: {e}") from e
    return budgets


class _MergeBudgets(argparse.Action):
    """``--max-memory 0=60KiB --max-memory cpu=30KiB``: the flags' budgets together (was:
    the last flag alone, the GPU dropped without a word). A key given in two flags is
    refused here; two names of one device (``0``, ``cuda:0``) where the budgets are read."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        assert isinstance(values, dict)
        budgets = dict(getattr(namespace, self.dest, None) or {})
        again = [k for k in values if k in budgets]
        if again:
            raise argparse.ArgumentError(self, f"{again[0]} is given twice")
        setattr(namespace, self.dest, {**budgets, **values})


def _device_key(key: str) -> str | int:
    """``"0"`` → ``0`` (a GPU index, as transformers takes it), a name as it is."""
    return int(key) if key.isascii() and key.isdigit() else key
