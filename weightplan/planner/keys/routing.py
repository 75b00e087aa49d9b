"""Phase 1's results: each key's :class:`Route`, the :class:`Group` objects they form.

For each key (natural order): every matching renaming fires, in list order, chained;
then the first matching converter claims the key (:mod:`~.applier`). Keys claimed by
one converter with the same surroundings (text before and after the match, captured
groups: :func:`bucket_of`) form a :class:`Group` (:mod:`~.groups`); an unclaimed key is
a group of its own. When a model is known, two fix-ups keep real checkpoints loading
(:mod:`~.router`): the model's ``base_model_prefix`` is added or removed (after the
renamings, or before them so mappings scoped to a submodule path see the key) when that
makes the key exist, and a key whose transformed name is unknown but whose original name
exists keeps its original name. Both are recorded on the route's ``note``; a prefix
fix-up also on its ``saved_as`` (the key without it, which a save writes).
"""

from __future__ import annotations

from dataclasses import dataclass

from weightplan.errors import MappingError
from weightplan.planner.core.ops.base import ConversionOp
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.keys.transforms import (
    ConverterMatch, Renaming, WeightConverter,
)


@dataclass(frozen=True, slots=True)
class Route:
    """What phase 1 decided for one checkpoint key."""

    key: str
    renamed: str  # the key after every renaming (and prefix fix-up)
    fired: tuple[Renaming, ...]  # renamings that changed it, in order
    converter: WeightConverter | None = None  # the converter that claimed it; None: plain
    claim: ConverterMatch | None = None  # how its source pattern matched (claimed keys)
    note: str = ""
    # the key this model's own checkpoint holds for it, where a base-model-prefix fix-up
    # made it land (the checkpoint was another head class's): what a save writes, as
    # transformers' save_pretrained writes the model's own names; None: ``key``
    saved_as: str | None = None

    @property
    def match(self) -> ConverterMatch:
        """How the claiming converter matched (only for claimed keys)."""
        assert self.claim is not None, self.key
        return self.claim


@dataclass(frozen=True, slots=True)
class Group:
    """Keys consumed together: one converter application, one renamed key, or (saving) one
    loaded conversion read backwards, its inverse op chain given as ``operations``."""

    converter: WeightConverter | None
    sources: tuple[tuple[TensorEntry, ...], ...]  # per source pattern, ordered by index
    routes: tuple[tuple[Route, ...], ...]  # aligned with ``sources``
    targets: tuple[str, ...]  # target keys; ``*`` still stands for an output index
    explicit: tuple[tuple[str, ...], ...] | None = None  # exact output keys per stream (saves)
    post_rename: tuple[Renaming, ...] = ()  # applied to every output key (inverse renamings)
    operations: tuple[ConversionOp, ...] = ()  # the op chain when there is no converter

    @property
    def ops(self) -> tuple[ConversionOp, ...]:
        """The op chain: the converter's, else ``operations``."""
        return self.converter.operations if self.converter is not None else self.operations

    @property
    def entries(self) -> tuple[TensorEntry, ...]:
        return tuple(e for stream in self.sources for e in stream)

    def output_key(self, stream: int, index: int) -> str:
        """The key of output ``index`` of output stream ``stream``."""
        if self.explicit is None and not self.post_rename:  # (no renaming to record)
            pattern = self.targets[stream]
            return pattern.replace("*", str(index)) if "*" in pattern else pattern
        return self.renamed_output(stream, index)[0]

    def renamed_output(self, stream: int, index: int) -> tuple[str, tuple[Renaming, ...]]:
        """The output key and the post renamings that fired on it."""
        if self.explicit is not None:
            key = self.explicit[stream][index]
        else:
            pattern = self.targets[stream]
            key = pattern.replace("*", str(index)) if "*" in pattern else pattern
        fired = []
        for renaming in self.post_rename:
            new = renaming.rename(key)
            if new is not None:
                key = new
                fired.append(renaming)
        return key, tuple(fired)


@dataclass(frozen=True)
class Incomplete:
    """A converter group lacking some of its source patterns."""

    converter: WeightConverter
    targets: tuple[str, ...]
    present: tuple[str, ...]  # checkpoint keys found
    missing_patterns: tuple[str, ...]

    def describe(self) -> str:
        """What is wrong, for errors and findings: the converter, the keys found, what's missing."""
        return (f"{self.converter.describe()}: found {', '.join(self.present)} "
                f"but nothing for {', '.join(self.missing_patterns)}")


@dataclass(frozen=True)
class Routing:
    """Phase 1's result: every key's route (in natural key order), the groups (in the
    order of their first key), the converter groups lacking a source pattern."""

    routes: tuple[Route, ...]
    groups: tuple[Group, ...]
    incomplete: tuple[Incomplete, ...]

    def require_complete(self, what: str = "") -> None:
        """Raise :class:`MappingError` for the first group lacking a source pattern, where
        one can't be skipped (saves); ``what`` leads the message (``"inverse "``)."""
        if self.incomplete:
            raise MappingError(what + self.incomplete[0].describe())


def bucket_of(route: Route) -> object:
    """The group ``route`` belongs to: a plain key is a group of its own; a claimed key's
    is its converter's (by identity: hashing a converter hashes its patterns and ops) with
    the match's surroundings."""
    m = route.claim
    return route.key if m is None else (id(route.converter), m.head, m.tail, m.match.groups)
