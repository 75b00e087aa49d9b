"""Phase 1: route every checkpoint key through renamings to at most one converter.

For each key (natural order): every matching renaming fires, in list order, chained;
then the first matching converter claims the key. Keys claimed by one converter with
the same surroundings (text before and after the match, captured groups) form a
:class:`Group`; an unclaimed key is a group of its own. When a model is known, two
fix-ups keep real checkpoints loading: the model's ``base_model_prefix`` is added or
removed (after the renamings, or before them so mappings scoped to a submodule path see
the key) when that makes the key exist, and a key whose transformed name is unknown but
whose original name exists keeps its original name. Both are recorded on the route.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from weightplan.errors import ConflictingTransformError, IndexGapError
from weightplan.planner.core.ops.base import ConversionOp
from weightplan.planner.inputs.checkpoint import Checkpoint, TensorEntry
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.keys.transforms import (
    ConverterMatch, Renaming, WeightConverter, WeightRenaming,
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

    @property
    def match(self) -> ConverterMatch:
        """How the claiming converter matched (only for claimed keys)."""
        assert self.claim is not None, self.key
        return self.claim


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Routing:
    routes: tuple[Route, ...]
    groups: tuple[Group, ...]
    incomplete: tuple[Incomplete, ...]


def _apply(key: str, renamings: Sequence[Renaming], converters: Sequence[WeightConverter]
           ) -> Route:
    name, fired = key, []
    for r in renamings:
        new = r.rename(name)
        if new is not None:
            fired.append(r)
            name = new
    for c in converters:
        m = c.match(name)
        if m is not None:
            return Route(key, name, tuple(fired), c, m)
    return Route(key, name, tuple(fired))


def _lands(route: Route, model: ModelInfo | frozenset[str]) -> bool:
    if route.converter is None:
        return route.renamed in model
    targets = route.converter.target_keys(route.match)
    return any(t in model for t in targets if "*" not in t) or any("*" in t for t in targets)


def bucket_of(route: Route) -> object:
    """Which group ``route`` joins: a plain key is its own; a claimed one's is its
    converter's (by identity: hashing a converter hashes its patterns and ops) with the
    match's surroundings."""
    m = route.claim
    return route.key if m is None else (id(route.converter), m.head, m.tail, m.match.groups)


def _group(routes: tuple[Route, ...], checkpoint: Checkpoint
           ) -> tuple[tuple[Group, ...], tuple[Incomplete, ...]]:
    buckets: dict[object, list[Route]] = {}
    for r in routes:
        m = r.claim
        # (bucket_of inlined: this loop runs once per key)
        ident = r.key if m is None else (id(r.converter), m.head, m.tail, m.match.groups)
        bucket = buckets.get(ident)
        if bucket is None:
            buckets[ident] = [r]
        else:
            bucket.append(r)
    groups: list[Group] = []
    incomplete: list[Incomplete] = []
    entries = checkpoint.entries
    for members in buckets.values():
        first = members[0]
        if first.converter is None:
            groups.append(Group(None, ((entries[first.key],),), ((first,),), (first.renamed,)))
            continue
        group = _converter_group(first.converter, members, checkpoint)
        if isinstance(group, Group):
            groups.append(group)
        else:
            incomplete.append(group)
    return tuple(groups), tuple(incomplete)


def _converter_group(converter: WeightConverter, members: list[Route], checkpoint: Checkpoint
                     ) -> Group | Incomplete:
    targets = converter.target_keys(members[0].match)
    streams: list[list[Route]] = [[] for _ in converter.source_patterns]
    indices: list[list[int | None]] = [[] for _ in converter.source_patterns]
    for r in members:
        m = r.claim
        assert m is not None, r.key  # a converter's bucket holds the keys it claimed
        streams[m.source_index].append(r)
        indices[m.source_index].append(m.match.index)
    missing = tuple(p for p, s in zip(converter.source_patterns, streams, strict=True) if not s)
    if missing:
        return Incomplete(converter, targets, tuple(r.key for r in members), missing)
    ordered = []
    for pattern, source, stream, found in zip(converter.source_patterns, converter.sources,
                                              streams, indices, strict=True):
        ordered.append(_ordered_stream(converter, pattern, source.has_index, stream, found,
                                       targets, checkpoint))
    _check_counts(converter, ordered, targets)
    entries = checkpoint.entries
    sources = tuple(tuple([entries[r.key] for r in s]) for s in ordered)
    return Group(converter, sources, tuple(tuple(s) for s in ordered), targets)


def _index(route: Route) -> int:
    index = route.match.match.index
    assert index is not None, route.key  # only sources with an index wildcard are ordered
    return index


def _ordered_stream(converter: WeightConverter, pattern: str, has_index: bool,
                    stream: list[Route], found: list[int | None], targets: tuple[str, ...],
                    checkpoint: Checkpoint) -> list[Route]:
    if not has_index:
        if len(stream) > 1:
            raise ConflictingTransformError(
                f"{converter.describe()}: source {pattern!r} matched several keys for one "
                f"group ({', '.join(r.key for r in stream)}); anchor the pattern or use `*`")
        return stream
    if found == list(range(len(stream))):
        return stream  # routes come in natural key order: usually sorted by index already
    stream = sorted(stream, key=_index)
    indices = [_index(r) for r in stream]
    if indices != list(range(len(indices))):
        present = set(indices)
        gaps = [i for i in range(max(indices) + 1) if i not in present]
        dupes = sorted({i for i in indices if indices.count(i) > 1})
        what = f"indices {gaps} are missing" if gaps else f"indices {dupes} appear twice"
        raise IndexGapError(f"{converter.describe()}: for {targets[0]}, source {pattern!r} "
                            f"collected {len(indices)} tensors but {what} (e.g. near "
                            f"{stream[0].key} in "
                            f"{checkpoint.entries[stream[0].key].file or '<memory>'})")
    return stream


def _check_counts(converter: WeightConverter, ordered: list[list[Route]],
                  targets: tuple[str, ...]) -> None:
    counts = {len(s) for s, src in zip(ordered, converter.sources, strict=True) if src.has_index}
    if len(counts) > 1:
        sizes = {p: len(s) for p, s in zip(converter.source_patterns, ordered, strict=True)}
        raise IndexGapError(f"{converter.describe()}: for {targets[0]} the source patterns "
                            f"collected different counts {sizes}; an index is missing")


def check_conflicts(renamings: Sequence[Renaming], converters: Sequence[WeightConverter]) -> None:
    """Two converters claiming one pattern, or a renaming that rewrites a converter's output."""
    seen: dict[tuple[str | None, str], WeightConverter] = {}
    for c in converters:
        for pattern in c.source_patterns:
            other = seen.setdefault((c.scope_prefix, pattern), c)
            if other is not c:
                raise ConflictingTransformError(
                    f"two converters claim source pattern {pattern!r}: {other.describe()} and "
                    f"{c.describe()}")
    for r in renamings:
        if not isinstance(r, WeightRenaming):
            continue
        for c in converters:
            for t in c._targets:
                sample = t.expand(("0",) * t.max_group, "0")
                scoped = f"{c.scope_prefix}.{sample}" if c.scope_prefix else sample
                if r.rename(scoped) is not None:
                    raise ConflictingTransformError(
                        f"renaming ({r.describe()}) rewrites {sample!r}, the output of "
                        f"converter ({c.describe()}); renamings run before converters, so it "
                        "would never see that key. Rename the converter's sources or change "
                        "its target instead.")
