"""No code from a checkpoint directory ever runs: configs that ask for it are refused.

A ``config.json`` with ``auto_map`` names classes defined in Python files shipped with the
checkpoint (``configuration_*.py``, ``modeling_*.py``). transformers 5.25 imports them only
under ``trust_remote_code=True``, or when it has no class of its own for the config's
``model_type``; without ``trust_remote_code``, a ``model_type`` it has built in (Phi-3's
``phi3``) is built from its own classes, ``auto_map`` ignored. weightplan does the same, and
refuses (:func:`refuse_remote_code`) where transformers would import code: it never does.
Every config is read with remote code disabled. The config is read as strict JSON from a
regular file (no FIFO, bounded size).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from weightplan.errors import CheckpointError, ModelBuildError
from weightplan.limits import MAX_CONFIG_BYTES
from weightplan.planner.inputs.checkpoint import DirectoryRead, variant_read
from weightplan.planner.inputs.paths import open_regular
from weightplan.planner.inputs.safetensors_format import strict_json



def read_config_bytes(path: Path) -> bytes:
    """A config file's bytes, if it is a regular file of at most
    :data:`weightplan.limits.MAX_CONFIG_BYTES` (:class:`ModelBuildError` otherwise)."""
    try:
        fd = open_regular(str(path))
        try:
            size = os.fstat(fd).st_size
            if MAX_CONFIG_BYTES.exceeded_by(size):
                raise ModelBuildError(f"{path}: {size} bytes is too large for a model "
                                      f"config; {MAX_CONFIG_BYTES.hint()}")
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)
    except (CheckpointError, OSError) as e:
        raise ModelBuildError(f"{path}: can't read this config: {e}") from e


def read_config_json(path: Path) -> dict:
    """``config.json`` (or ``generation_config.json``) as a dict; :class:`ModelBuildError`
    if it is not a regular file holding a JSON object of at most
    :data:`weightplan.limits.MAX_CONFIG_BYTES`."""
    raw = read_config_bytes(path)
    try:
        data = strict_json(raw, file=str(path), what="config")
    except CheckpointError as e:
        raise ModelBuildError(f"{path}: can't read this config: {e}") from e
    if not isinstance(data, dict):
        raise ModelBuildError(f"{path}: config.json is not a JSON object")
    return data


def read_directory(checkpoint: object, variant: object = None) -> DirectoryRead:
    """The checkpoint (a directory, or a file in one; ``variant``: its weight variant's
    files, :func:`~weightplan.planner.inputs.checkpoint.variant_read`) with its directory's
    ``config.json`` read (once: everything after uses what was read; the headers are read
    at their first use).

    Raises:
        ArgumentError: a ``variant`` that is no word of a file name, or given for a file.
        ModelBuildError: a ``config.json`` that can't be read (:func:`read_config_json`).
    """
    read = variant_read(checkpoint, variant)
    config = read.directory / "config.json"
    if read.config is not None or not config.is_file():
        return read
    return DirectoryRead(read.path, read_config_json(config), read.variant)


def refuse_remote_code(path: Path, read: Mapping[str, object] | None = None, *,
                       trust_remote_code: object = None, built_in: bool = False,
                       auto_class: str | None = None) -> dict:
    """The config (``read``: as already read from ``path``), unless a transformers load of
    it would import code shipped with the checkpoint (:func:`imported_entries`).

    Args:
        trust_remote_code: as passed to ``from_pretrained``.
        built_in: whether transformers has a config class of its own for the config's
            ``model_type``.
        auto_class: the auto class the load stands for (``AutoModelForSequenceClassification``);
            ``None``: any (the class ``architectures`` names); ``""``: a model class given
            (transformers builds a model class from its own config class, whatever the config's
            ``auto_map`` says).

    Raises:
        ModelBuildError: transformers would import the config's or a model's class named in
            ``auto_map`` (the message names the entries, says why and what to do).
    """
    config = read_config_json(path) if read is None else dict(read)
    names = imported_entries(config.get("auto_map"), trust_remote_code=trust_remote_code,
                             built_in=built_in, auto_class=auto_class)
    if names:
        why = ("under trust_remote_code=True" if built_in else
               f"as it has no class of its own for model_type {config.get('model_type')!r}")
        raise ModelBuildError(
            f"{path}: this config's auto_map ({names}) names Python code shipped with the "
            f"checkpoint, which transformers would import ({why}); weightplan never runs code "
            "from a checkpoint directory. To load it, review that code, build the model "
            "yourself (with weightplan.init_empty(): model = Cls(config)) and "
            "weightplan.load(model, path); or pass --model-type to explain the keys without "
            "a model" + ("; without trust_remote_code, transformers' own classes are built, "
                         "auto_map ignored" if built_in else ""))
    return config


def imported_entries(auto_map: object, *, trust_remote_code: object = None,
                     built_in: bool = False, auto_class: str | None = None) -> list[str]:
    """The entries of ``auto_map`` whose code transformers 5.25's ``from_pretrained``
    imports (see :func:`refuse_remote_code` for the arguments): all that a model load would
    (:func:`remote_entries`) when it has no class for the ``model_type`` (it refuses without
    ``trust_remote_code``, and imports them with it); with one, none unless
    ``trust_remote_code=True``: then ``AutoConfig`` and the auto class's own entry (an auto
    class not named in ``auto_map`` builds transformers' class; a model class given builds
    from its own config class, nothing imported)."""
    names = remote_entries(auto_map)
    if not names or not built_in:
        return names
    if trust_remote_code is not True or auto_class == "":
        return []
    return [n for n in names if n == "AutoConfig" or auto_class in (None, n)]


def remote_entries(auto_map: object) -> list[str]:
    """The entries of ``auto_map`` a model load would import: ``AutoConfig`` and the
    ``AutoModel*`` classes (any entry of a value that is not a dict: it can't be told)."""
    if not auto_map:
        return []
    if not isinstance(auto_map, dict):
        return [str(auto_map)]
    return sorted(str(k) for k in auto_map
                  if not isinstance(k, str) or k == "AutoConfig" or k.startswith("AutoModel"))
