"""Where a checkpoint named by ``from_pretrained`` / ``weightplan explain`` is: a local path
as it is, else a Hugging Face repo id's snapshot.

A name that is not on disk but looks like ``org/name`` is tried as a repo id: the local
cache first (offline), the Hub only when the cache lacks it, or holds its snapshot without
the weights (the config.json ``AutoConfig.from_pretrained`` fetched, a download cut short),
and the Hub is not disabled (``HF_HUB_OFFLINE=1`` or ``local_files_only=True``); only
safetensors and JSON files are fetched. When that fails too, the error says first that there is no local file or
directory of that name (with the names nearby, for a typo), then what the Hub attempt
found, then the offline way out, in weightplan's words.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

from weightplan.errors import CheckpointError
from weightplan.planner.inputs.variants import check_variant

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
HUB_FILES = ("*.safetensors", "*.json")
ADAPTER_FILE = "adapter_model.safetensors"  # peft's SAFETENSORS_WEIGHTS_NAME


def hub_files(variant: str | None) -> tuple[str, ...]:
    """What is fetched of a repo: its safetensors and JSON files; with a ``variant``, the
    JSON files and that variant's files only (its one file, its shards as transformers 5
    and the older savers name them), as transformers fetches only the variant's, and an
    adapter's file beside them (peft's have no variant: transformers fetches it too)."""
    if variant is None:
        return HUB_FILES
    return (f"model.{variant}.safetensors", f"model.{variant}-*.safetensors",
            f"model-*.{variant}.safetensors", ADAPTER_FILE, "*.json")


def refuse_repo_id(checkpoint: object, caller: str, adapter: bool = False) -> None:
    """``explain`` / ``load`` read local checkpoints (SPEC: a file, a directory, files, a
    dict); a name that is not on disk but reads as ``org/name`` is refused saying where a
    repo id is resolved (nothing is looked up on the Hub or in its cache here).

    Raises:
        CheckpointError: naming the repo id, and the two ways to load it."""
    if not isinstance(checkpoint, (str, os.PathLike)) or os.path.exists(checkpoint) \
            or not REPO_ID.match(os.fspath(checkpoint)):
        return
    name = os.fspath(checkpoint)
    loads = f"BASE, adapter={name!r}, " if adapter else f"{name!r}, "
    raise CheckpointError(
        f"no such file or directory; {caller} reads a local checkpoint (a file, a directory, "
        "files or a dict), and a Hugging Face repo id is resolved by "
        f"weightplan.from_pretrained({loads}...) (cache_dir=, revision=, token=, "
        "local_files_only=), or pass the directory "
        f"huggingface_hub.snapshot_download({name!r}) returns", file=name)


def resolve_checkpoint(name_or_path: str | os.PathLike[str], *, revision: str | None = None,
                       cache_dir: str | os.PathLike[str] | None = None,
                       local_files_only: bool = False, token: str | bool | None = None,
                       subfolder: str | None = None, variant: str | None = None) -> Path:
    """A local checkpoint path, or the local snapshot of a Hub repo id (``subfolder``: the
    checkpoint inside it; ``variant``: the weight variant needed, :func:`hub_files`).

    Raises:
        CheckpointError: the path doesn't exist and isn't a repo id, or the repo can't
            be found in the cache nor downloaded (the message says which and why).
        ArgumentError: a ``variant`` that is no word of a file name (before it names files
            to fetch).
    """
    path, variant = Path(name_or_path), check_variant(variant)
    if not path.exists() and REPO_ID.match(str(name_or_path)):
        try:
            import huggingface_hub as hub
        except ImportError as e:
            raise CheckpointError(f"{_not_local(path)}; as a Hugging Face repo id it needs "
                                  "huggingface_hub (pip install huggingface_hub)") from e
        found = _snapshot(hub, path, dict(revision=revision, token=token, cache_dir=None if
                                          cache_dir is None else str(cache_dir)),
                          local_files_only, subfolder, variant)
        if not found.exists():  # (the Hub asked: the repo has no such folder)
            raise CheckpointError(f"{name_or_path}: the repo has no folder {subfolder}/ "
                                  f"({found} doesn't exist)")
        return found
    if subfolder and path.is_dir() and not (path / subfolder).exists():
        raise CheckpointError(f"{_not_local(path / subfolder)} (subfolder={subfolder!r})")
    path = path / subfolder if subfolder else path
    if not path.exists():
        raise CheckpointError(f"{_not_local(path)}, and it is not a Hugging Face repo id "
                              "(org/name)")
    return path


def _not_local(path: Path) -> str:
    """'no local file or directory NAME', with the nearby names a typo may have meant."""
    parent = path.parent if str(path.parent) else Path(".")
    where = f"{path}: no local file or directory of that name"
    if not parent.is_dir():
        return f"{where} (nor {parent}/ under {Path.cwd()})" if not parent.is_absolute() else \
            f"{where} (nor {parent}/)"
    try:
        names = sorted(p.name for p in parent.iterdir())
    except OSError:
        return where
    close = difflib.get_close_matches(path.name, names, n=3, cutoff=0.6)
    if close:
        return f"{where} (did you mean {', '.join(str(parent / c) for c in close)}?)"
    return f"{where} in {parent.resolve()}"


def _snapshot(hub: Any, path: Path, options: dict[str, Any], local_only: bool,
              subfolder: str | None, variant: str | None) -> Path:
    repo_id = str(path)
    patterns = [f"{subfolder}/{p}" if subfolder else p for p in hub_files(variant)]
    kwargs = dict(repo_id=repo_id, allow_patterns=patterns, **options)
    offline = local_only or os.environ.get("HF_HUB_OFFLINE", "").strip() not in ("", "0")
    why = "local_files_only=True" if local_only else "HF_HUB_OFFLINE is set"
    try:
        found = Path(hub.snapshot_download(**kwargs, local_files_only=True))
    except Exception as cached_error:  # LocalEntryNotFoundError and the like
        if offline:
            raise CheckpointError(f"{_not_local(path)}; as a Hugging Face repo id it is not in "
                                  f"the local cache{_at(options)}, and {why} so the Hub was not asked; "
                                  f"{_way_out(repo_id, options)}") from cached_error
    else:  # a snapshot is cached: with the weights, or only what another call fetched
        lacking = _lacking(found / subfolder if subfolder else found, variant)
        if lacking is None:
            return found / subfolder if subfolder else found
        if offline:
            raise CheckpointError(f"{repo_id}: the local cache holds the repo's snapshot "
                                  f"{found.name} without its weights ({lacking}), and {why} "
                                  f"so the Hub was not asked; {_way_out(repo_id, options)}")
    try:
        found = Path(hub.snapshot_download(**kwargs))
    except Exception as e:  # network, authentication, unknown repo: all hub errors
        raise CheckpointError(f"{_not_local(path)}; as a Hugging Face repo id: "
                              f"{_hub_said(e, options)}; {_way_out(repo_id, options)}") from e
    return found / subfolder if subfolder else found


def _lacking(directory: Path, variant: str | None) -> str | None:
    """What a cached snapshot (folder) lacks to be loaded, or ``None``: files the Hub
    has but another call didn't fetch (``AutoConfig.from_pretrained`` caches config.json
    alone) or a download cut short (a shard its index names, an adapter's file)."""
    from weightplan.planner.inputs.checkpoint import directory_files

    if not directory.is_dir():
        return f"no folder {directory.name}/"
    if (directory / "adapter_config.json").is_file():
        if not (directory / ADAPTER_FILE).is_file():
            return f"adapter_config.json without {ADAPTER_FILE}"
        if not (directory / "config.json").is_file():
            return None  # an adapter alone: the variant is its base's, resolved on its own
    try:
        directory_files(directory, variant)
    except CheckpointError as e:
        return str(e).removeprefix(f"{directory}: ").removeprefix(f"{directory}/")
    return None


def _hub_said(error: BaseException, options: dict[str, Any]) -> str:
    """What the Hub attempt found, from huggingface_hub's error classes (by name: they moved
    between versions)."""
    names = {c.__name__ for c in type(error).__mro__}
    if "GatedRepoError" in names:
        return "the repo is gated: accept its terms on the Hub, then log in (hf auth login) or pass token="
    if "RepositoryNotFoundError" in names:
        return ("the Hub has no repo of that name (or it is private: log in with hf auth login, "
                "or pass token=)")
    if "RevisionNotFoundError" in names:
        return f"the repo has no revision {options.get('revision')!r}"
    cause = error.__cause__ or error.__context__
    if "LocalEntryNotFoundError" in names or "OfflineModeIsEnabled" in names:
        detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        return f"it is not in the local cache and the Hub can't be reached{detail}"
    return f"the Hub attempt failed: {type(error).__name__}: {' '.join(str(error).split())}"


def _at(options: dict[str, Any]) -> str:
    """' at revision R' where one was asked (the cache may hold the repo at another)."""
    revision = options.get("revision")
    return "" if revision is None else f" at revision {revision!r}"


def _way_out(repo_id: str, options: dict[str, Any]) -> str:
    cache = options.get("cache_dir") or "the default cache (HF_HUB_CACHE)"
    revision = options.get("revision")
    fetch = repo_id if revision is None else f"{repo_id} --revision {revision}"
    return (f"to use it offline, download it once where the Hub is reachable (hf download "
            f"{fetch}) into {cache}, then pass local_files_only=True or set HF_HUB_OFFLINE=1; "
            "or pass the path of a local checkpoint directory")
