"""A checkpoint directory's weight variants (``model.fp16.safetensors``), named as
transformers' ``save_pretrained(variant=...)`` names them and its ``from_pretrained(variant=
...)`` picks them.

With ``variant="fp16"``, transformers reads ``model.fp16.safetensors``, else the shards that
``model.safetensors.index.fp16.json`` names (``model.fp16-00001-of-00002.safetensors`` from
transformers 5, ``model-00001-of-00002.fp16.safetensors`` from older savers: the index
decides), else fails. Without a variant it reads ``model.safetensors`` or the plain index,
else fails ('no file named model.safetensors'): a directory holding a variant's files and
neither is refused here too, the variants named and how to pick one (read as they are, one
variant's files loaded as if ``variant=`` were given; several held every key twice).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from weightplan.errors import ArgumentError, CheckpointError

__all__ = ["check_variant", "missing_variant", "refuse_variants", "variant_index",
           "variant_of", "variant_single", "variants_found"]

# the names a variant takes: a shard (transformers 5's, and the older savers'), the single
# file, the index (the first that matches says)
_NAMES = (re.compile(r"^model\.(?P<v>[^.]+)-\d+-of-\d+\.safetensors$"),
          re.compile(r"^model\.(?P<v>[^.]+)\.safetensors$"),
          re.compile(r"^model-\d+-of-\d+\.(?P<v>[^.]+)\.safetensors$"),
          re.compile(r"^model\.safetensors\.index\.(?P<v>[^.]+)\.json$"))
_WORD = re.compile(r"^[\w\-]+$")  # a variant is one component of a file name


def check_variant(variant: object) -> str | None:
    """``variant`` as a file names it (``None``: no variant).

    Raises:
        ArgumentError: not a string, or not one word of a file name (``fp16``, ``bf16``).
    """
    if variant is None:
        return None
    if not isinstance(variant, str) or not _WORD.match(variant):
        raise ArgumentError(f"variant={variant!r}: pass the word a variant's files carry "
                            "(model.fp16.safetensors: variant='fp16')")
    return variant


def variant_single(variant: str) -> str:
    """The variant's one-file name, as transformers' ``_add_variant`` makes it."""
    return f"model.{variant}.safetensors"


def variant_index(variant: str) -> str:
    """The variant's index name."""
    return f"model.safetensors.index.{variant}.json"


def variant_of(name: str) -> str | None:
    """The variant a weight file's name carries (``None``: none)."""
    for pattern in _NAMES:
        found = pattern.match(name)
        if found:
            return found.group("v")
    return None


def variants_found(names: Iterable[str]) -> list[str]:
    """The variants ``names`` hold, sorted."""
    return sorted({v for v in map(variant_of, names) if v is not None})


def _listed(variants: list[str]) -> str:
    return ", ".join(repr(v) for v in variants) or "none"


def missing_variant(path: Path, variant: str) -> CheckpointError:
    """The error for a directory without ``variant``'s files, naming those it has."""
    found = variants_found(p.name for p in path.iterdir())
    return CheckpointError(f"no {variant_single(variant)} nor {variant_index(variant)} "
                           f"(variant={variant!r}); the variants here: {_listed(found)}",
                           file=str(path))


def refuse_variants(path: Path, names: list[str]) -> None:
    """Refuse to read ``names`` (a directory's every ``.safetensors`` file, with no
    ``model.safetensors`` nor index, read with no variant) when some are a variant's files,
    as transformers refuses the directory without ``variant=``.

    Raises:
        CheckpointError: naming the variants and saying ``variant=``.
    """
    variants = variants_found(names)
    if not variants:
        return  # no variant: every file is the checkpoint's
    plain = [n for n in names if variant_of(n) is None]
    also = f", and files of no variant ({', '.join(plain[:3])})" if plain else ""
    why = (f"the weight variant {variants[0]!r}{also} (transformers' from_pretrained refuses it "
           "too: 'no file named model.safetensors'); pass" if len(variants) == 1 else
           f"the weight variants {_listed(variants)}{also}: read together they would hold each "
           "key more than once; pick one: pass")
    raise CheckpointError(f"no model.safetensors nor model.safetensors.index.json, only {why} "
                          f"variant={variants[0]!r} (as transformers' from_pretrained(variant=...))",
                          file=str(path))
