"""``weightplan.from_pretrained``: a checkpoint directory or Hub repo id → a loaded model.

1. resolve: a local path is used as it is; a repo id (``org/name``) goes through
   ``huggingface_hub.snapshot_download`` for the safetensors and JSON files only: the
   local cache first (offline), the Hub only when the cache lacks it and the Hub is not
   disabled (``HF_HUB_OFFLINE=1``);
2. build: the transformers class ``config.json`` names, on meta (:func:`init_empty`);
   remote code never runs (no ``trust_remote_code``, nothing imported from the directory);
3. explain with ``dtype="auto"`` (the config's dtype, else the checkpoint's), execute;
4. like transformers: the model's generation config is read and it is put in eval mode.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from weightplan.errors import CheckpointError, ModelBuildError

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
HUB_FILES = ["*.safetensors", "*.json"]


def resolve_checkpoint(name_or_path: str | os.PathLike, *, revision: str | None = None,
                       cache_dir: str | os.PathLike | None = None) -> Path:
    """A local checkpoint path, or the local snapshot of a Hub repo id.

    Raises:
        CheckpointError: the path doesn't exist and isn't a repo id, or the repo can't
            be found in the cache nor downloaded (the message says which and why).
    """
    path = Path(name_or_path)
    if path.exists() or not REPO_ID.match(str(name_or_path)):
        if not path.exists():
            raise CheckpointError(f"{name_or_path}: no such file or directory, and not a "
                                  "Hugging Face repo id (org/name)")
        return path
    try:
        import huggingface_hub as hub
    except ImportError as e:
        raise CheckpointError(f"{name_or_path}: loading a repo id needs huggingface_hub "
                              "(pip install huggingface_hub)") from e
    return _snapshot(hub, str(name_or_path), revision, cache_dir)


def _snapshot(hub: Any, repo_id: str, revision: str | None,
              cache_dir: str | os.PathLike[str] | None) -> Path:
    kwargs = dict(repo_id=repo_id, revision=revision, allow_patterns=HUB_FILES,
                  cache_dir=None if cache_dir is None else str(cache_dir))
    try:
        return Path(hub.snapshot_download(**kwargs, local_files_only=True))
    except Exception as cached_error:  # LocalEntryNotFoundError and the like
        if os.environ.get("HF_HUB_OFFLINE", "").strip() not in ("", "0"):
            raise CheckpointError(f"{repo_id}: not in the local Hugging Face cache and "
                                  "HF_HUB_OFFLINE is set; download it first "
                                  "(huggingface-cli download)") from cached_error
    try:
        return Path(hub.snapshot_download(**kwargs))
    except Exception as e:  # network, authentication, unknown repo: all hub errors
        raise CheckpointError(f"{repo_id}: can't get it from the Hugging Face Hub: "
                              f"{type(e).__name__}: {e}") from e


def from_pretrained(name_or_path: str | os.PathLike, *, dtype: torch.dtype | str | None = "auto",
                    device: object = None, strict: bool = False, progress: bool | None = None,
                    return_report: bool = False, revision: str | None = None,
                    cache_dir: str | os.PathLike[str] | None = None, **explain_options: Any
                    ) -> Any:
    """Build the model a checkpoint's ``config.json`` names and load the checkpoint into it.

    Args:
        name_or_path: a checkpoint directory or a Hub repo id (``"org/name"``).
        dtype: ``"auto"`` (the config's dtype, else the checkpoint's), a torch dtype, or
            ``None`` (float32, as the model is built).
        device: where tensors go (see :func:`weightplan.explain`).
        strict, progress: as :meth:`Plan.execute`.
        return_report: also return the :class:`LoadReport`.
        revision, cache_dir: for repo ids, as ``huggingface_hub.snapshot_download``.
        **explain_options: ``mapping``, ``budget``, ``threads``, ...

    Returns:
        The model in eval mode, or ``(model, report)`` with ``return_report=True``.

    Example:
        >>> model = weightplan.from_pretrained("org/tiny-llama")          # doctest: +SKIP
    """
    from weightplan.bridge.hub import build_empty_model
    from weightplan.api.entry import explain

    directory = resolve_checkpoint(name_or_path, revision=revision, cache_dir=cache_dir)
    built = build_empty_model(directory)
    if device is not None:
        explain_options["device"] = device
    plan = explain(built.model, directory, dtype=dtype, **explain_options)
    report = plan.execute(strict=strict, progress=progress)
    model = built.model.eval()
    _generation_config(model, directory)
    return (model, report) if return_report else model


def _generation_config(model: torch.nn.Module, directory: Path) -> None:
    path = (directory if directory.is_dir() else directory.parent) / "generation_config.json"
    current = getattr(model, "generation_config", None)
    if current is None or not os.path.lexists(path):
        return
    from weightplan.bridge.config_guard import read_config_json

    data = read_config_json(path)  # a regular file, size-capped, strict JSON: then transformers
    try:
        generation = type(current).from_dict(data)
        generation._original_object_hash = hash(generation)  # as from_pretrained marks it
        model.generation_config = generation
    except Exception as e:  # transformers' own validation of the file
        raise ModelBuildError(f"{path}: transformers can't read this generation config: "
                              f"{type(e).__name__}: {e}") from e
