"""The public entry points' contract: typed arguments in, only ``WeightplanError`` out.

:func:`public` wraps a public function: its arguments are bound to its signature (a wrong
call is an :class:`ArgumentError`, not a ``TypeError``), checked by a validator where one
is given, and any exception that is not a :class:`WeightplanError` is wrapped in
:class:`UnexpectedError`, chained with ``from`` (``KeyboardInterrupt`` and other
``BaseException``\\ s pass through untouched). Validators here turn the classic mistakes
(arguments swapped, a path as the model, bytes as a path) into messages saying the fix.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any
from collections.abc import Callable, Mapping

import torch

from weightplan.errors import ArgumentError, WeightplanError
from weightplan.planner.inputs.checkpoint import Checkpoint, DirectoryRead
from weightplan.planner.inputs.paths import check_path_argument


def public(fn: Callable, check: Callable[[inspect.BoundArguments], None] | None = None
           ) -> Callable:
    """``fn`` with its arguments bound and checked, and every escaping error typed."""
    signature = inspect.signature(fn)
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            from weightplan.api.keywords import SAVES, drop_harmless_save_words

            kept = drop_harmless_save_words(kwargs) if name in SAVES else kwargs
            if len(kept) < len(kwargs):  # save_pretrained's keywords at values that ask for nothing
                return wrapper(*args, **kept)
            raise ArgumentError(_wrong_call(name, signature, args, kwargs, e)) from e
        if check is not None:
            check(bound)
        return call_typed(name, fn, *args, **kwargs)

    wrapper.__signature__ = signature  # type: ignore[attr-defined]
    return wrapper


def _wrong_call(name: str, signature: inspect.Signature, args: tuple, kwargs: dict,
                error: TypeError | None) -> str:
    """A call that doesn't bind, said with the fix: a keyword transformers uses (a user
    migrating types ``torch_dtype=``, ``tp_plan=``) gets weightplan's word for it."""
    from weightplan.api.keywords import SAVES, keyword_advice, shown

    for keyword in kwargs:
        if keyword not in signature.parameters:
            advice = keyword_advice(keyword, name)
            if advice is not None:
                value = f"={shown(kwargs[keyword])}" if name in SAVES else "=..."
                return f"{name}({keyword}{value}): {advice}"
    return unbound_text(name, signature, len(args), kwargs, error)


def unbound_text(name: str, signature: inspect.Signature, given: int, kwargs: Mapping,
                 error: object) -> str:
    """Why a call of ``name`` doesn't bind, short: the unknown keyword and the one it is
    closest to, or what goes by position; with the keywords ``name`` takes (never the whole
    signature, whose thousand characters hid the reason at their end)."""
    from weightplan.api.keywords import did_you_mean

    params = signature.parameters.values()
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                       p.POSITIONAL_OR_KEYWORD)]
    keywords = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    takes = f"its keywords: {', '.join(keywords)}" if keywords else "it takes no keywords"
    unknown = [k for k in kwargs if k not in signature.parameters]
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in params):
        close = did_you_mean(unknown[0], [*positional, *keywords])
        hint = f"; did you mean {close}=?" if close else ""
        return f"{name}() got an unexpected keyword argument {unknown[0]!r}{hint} ({takes})"
    if given > len(positional):
        return (f"{name}() takes {', '.join(positional)} by position, the rest by keyword "
                f"({takes}); got {given} positional arguments")
    return f"{name}(): {error} ({takes})"


def call_typed(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; a non-weightplan exception becomes :class:`UnexpectedError`."""
    from weightplan.errors import UnexpectedError

    try:
        return fn(*args, **kwargs)
    except WeightplanError:
        raise
    except RecursionError as e:
        raise UnexpectedError(f"{what}: input nested too deeply to process ({e})") from e
    except Exception as e:
        raise UnexpectedError(f"{what} failed: {type(e).__name__}: {e} (unexpected: please "
                              "report it with the traceback of the chained exception)") from e


def check_model(model: object, *, what: str = "model", optional: bool = True) -> None:
    """``model`` must be a ``torch.nn.Module`` (or ``None`` where ``optional``)."""
    if model is None and optional:
        return
    if isinstance(model, torch.nn.Module):
        return
    hint = ""
    if isinstance(model, Mapping):
        hint = (" (a dict: a state dict? The checkpoint goes second: "
                "explain(model, state_dict), or explain(None, state_dict) without a model)")
    elif isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        hint = (" (a path: the checkpoint goes second: explain(model, path), or "
                "explain(None, path) without a model)")
    allowed = "a torch.nn.Module or None" if optional else "a torch.nn.Module"
    raise ArgumentError(f"{what} must be {allowed}, got {type(model).__name__}{hint}")


def check_checkpoint(checkpoint: object) -> None:
    """A path, a list of paths or a ``{key: tensor}`` dict; bytes and NUL bytes refused."""
    if isinstance(checkpoint, Mapping):
        return
    if isinstance(checkpoint, (list, tuple)):
        for item in checkpoint:
            check_path_argument(item, what="checkpoint file")
        return
    if isinstance(checkpoint, torch.nn.Module):
        raise ArgumentError("checkpoint is a torch.nn.Module; pass model first: "
                            "explain(model, checkpoint)")
    if isinstance(checkpoint, (Checkpoint, DirectoryRead)):  # (opened, or read for a variant)
        return
    check_path_argument(checkpoint)


def check_flag(value: object, what: str) -> None:
    if value is not None and not isinstance(value, bool):
        raise ArgumentError(f"{what} must be True, False or None, got {value!r}")


def check_path(bound: inspect.BoundArguments) -> None:
    check_path_argument(bound.arguments.get("path"), what="path")


def check_names(bound: inspect.BoundArguments) -> None:
    """Registry calls: ``key`` / ``alias`` are strings, ``transforms`` a list or tuple."""
    for name in ("key", "alias"):
        if name in bound.arguments and not isinstance(bound.arguments[name], str):
            raise ArgumentError(f"{name} must be a str (a model_type or class name), got "
                                f"{type(bound.arguments[name]).__name__}")
    transforms = bound.arguments.get("transforms", ())
    if not isinstance(transforms, (list, tuple)):
        raise ArgumentError(f"transforms must be a list of WeightRenaming / WeightConverter / "
                            f"PrefixChange, got {type(transforms).__name__}")


def guard_methods(cls: type, checks: dict[str, Callable | None]) -> None:
    """Give methods of ``cls`` the :func:`public` contract (checked arguments, typed errors)."""
    for name, check in checks.items():
        setattr(cls, name, public(getattr(cls, name), check))


def check_explain(bound: inspect.BoundArguments) -> None:
    check_model(bound.arguments.get("model"))
    check_checkpoint(bound.arguments.get("checkpoint"))


def check_forwarded(name: str, fn: Callable, target: Callable, forwarded: Mapping) -> None:
    """``fn``'s ``**kwargs`` are ``target``'s keywords (``load`` → ``explain``): one that
    isn't is refused as a wrong call of ``fn``, listing both functions' keywords."""
    theirs = inspect.signature(target).parameters
    if any(k not in theirs for k in forwarded):
        own = [p for p in inspect.signature(fn).parameters.values()
               if p.kind is not p.VAR_KEYWORD]
        both = own + [p for p in theirs.values() if p.kind is p.KEYWORD_ONLY]
        raise ArgumentError(_wrong_call(name, inspect.Signature(both), (), dict(forwarded), None))


def check_load(bound: inspect.BoundArguments) -> None:
    check_explain(bound)
    check_flag(bound.arguments.get("strict", False), "strict")
    check_flag(bound.arguments.get("atomic", False), "atomic")
    check_flag(bound.arguments.get("progress"), "progress")


def check_save(bound: inspect.BoundArguments) -> None:
    check_model(bound.arguments.get("model"), optional=False)
    check_path_argument(bound.arguments.get("directory"), what="directory")
    check_flag(bound.arguments.get("overwrite", False), "overwrite")
    check_process_group(bound.arguments.get("process_group"))


def check_write_execute(bound: inspect.BoundArguments) -> None:
    """``WritePlan.execute``'s keywords, as :func:`check_save` checks ``save``'s."""
    check_flag(bound.arguments.get("progress"), "progress")
    check_process_group(bound.arguments.get("process_group"))


def check_process_group(group: object) -> None:
    """``process_group=``: ``None``, a ``ProcessGroup``, or a 1-D ``DeviceMesh``."""
    if group is None:
        return
    import torch.distributed as dist

    if dist.is_available() and isinstance(group, dist.ProcessGroup):
        return
    if getattr(group, "ndim", None) == 1 and hasattr(group, "get_group"):
        return
    raise ArgumentError(f"process_group must be a torch.distributed ProcessGroup or a 1-D "
                        f"DeviceMesh (the ranks that save together), got {type(group).__name__}")


def check_tensors(bound: inspect.BoundArguments) -> None:
    tensors = bound.arguments.get("tensors")
    if not isinstance(tensors, Mapping):
        raise ArgumentError(f"tensors must be a {{key: tensor}} dict, got "
                            f"{type(tensors).__name__}")


def check_explain_convert(bound: inspect.BoundArguments) -> None:
    check_checkpoint(bound.arguments.get("source"))
    check_path_argument(bound.arguments.get("directory"), what="directory")
    to = bound.arguments.get("to")
    if bound.arguments.get("dequantize") and to is not None:
        raise ArgumentError(f"dequantize=True and to={to!r} exclude each other: dequantize "
                            f"writes bf16, to={to!r} re-encodes MXFP4 as block FP8; pass one")
    if bound.arguments.get("reverse") and (bound.arguments.get("dequantize") or to is not None):
        what = "dequantize=True" if bound.arguments.get("dequantize") else f"to={to!r}"
        raise ArgumentError(f"reverse=True and {what} exclude each other: {what} keeps the "
                            "keys as they are; convert twice (reverse, then the other)")


def check_pretrained(bound: inspect.BoundArguments) -> None:
    """``from_pretrained``: a path or repo id first (a model there means ``explain``)."""
    name = bound.arguments.get("name_or_path")
    if isinstance(name, torch.nn.Module):
        raise ArgumentError("from_pretrained builds the model from the checkpoint's config.json;"
                            " to load into a model you have: weightplan.load(model, path)")
    check_path_argument(name, what="name_or_path")
    for flag in ("strict", "return_report", "output_loading_info", "local_files_only"):
        check_flag(bound.arguments.get(flag, False), flag)
    check_flag(bound.arguments.get("progress"), "progress")
