"""The :class:`LoadReport` returned by ``plan.execute()``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from weightplan.units import counted, format_bytes


@dataclass(frozen=True)
class LoadReport:
    """What a load did and what it cost.

    ``peak_bytes`` is the most memory the executor held at once (allocated model tensors
    plus temporaries), counted exactly; ``rss_peak_bytes`` is the growth of the process's
    peak resident memory during the load as the OS measured it (``None`` when the OS
    can't tell). ``initialized`` lists missing tensors given fresh values on a meta model.
    """

    bytes_read: int
    bytes_needed: int
    seconds: float
    peak_bytes: int
    planned_peak_bytes: int
    rss_peak_bytes: int | None
    tensors_loaded: int
    threads: int
    stage_seconds: Mapping[str, float] = field(default_factory=dict)
    missing: frozenset[str] = frozenset()
    unexpected: frozenset[str] = frozenset()
    initialized: Mapping[str, str] = field(default_factory=dict)
    offloaded: Mapping[str, str] = field(default_factory=dict)  # name → file (disk offload)
    device_bytes: Mapping[str, int] = field(default_factory=dict)  # loaded bytes per device
    staging_bytes: int = 0  # pinned host buffers device copies went through
    offload_written_bytes: int = 0  # of the disk's bytes, those written to offload_folder

    @property
    def gb_per_s(self) -> float:
        """Read throughput in GB/s (10^9 bytes)."""
        return self.bytes_read / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "bytes_read": self.bytes_read, "bytes_needed": self.bytes_needed,
            "seconds": self.seconds, "gb_per_s": self.gb_per_s, "peak_bytes": self.peak_bytes,
            "planned_peak_bytes": self.planned_peak_bytes, "rss_peak_bytes": self.rss_peak_bytes,
            "tensors_loaded": self.tensors_loaded, "threads": self.threads,
            "stage_seconds": dict(self.stage_seconds), "missing": sorted(self.missing),
            "unexpected": sorted(self.unexpected), "initialized": dict(self.initialized),
            "offloaded": dict(self.offloaded), "device_bytes": dict(self.device_bytes),
            "staging_bytes": self.staging_bytes,
            "offload_written_bytes": self.offload_written_bytes,
        }

    def __str__(self) -> str:
        from weightplan.terminal import terminal_text  # (shown: a load that isn't printed doesn't need it)

        stages = ", ".join(f"{k} {v:.2f}s" for k, v in self.stage_seconds.items())
        rss = "n/a" if self.rss_peak_bytes is None else format_bytes(self.rss_peak_bytes)
        over = (f" for {format_bytes(self.bytes_needed)} needed"
                if self.bytes_read != self.bytes_needed else "")
        lines = [
            f"loaded {counted(self.tensors_loaded, 'tensor')}: {format_bytes(self.bytes_read)} read{over} "
            f"in {self.seconds:.2f}s ({self.gb_per_s:.2f} GB/s, {counted(self.threads, 'thread')})",
            f"peak held {format_bytes(self.peak_bytes)} (planned "
            f"{format_bytes(self.planned_peak_bytes)}), process peak RSS +{rss}",
        ]
        if stages:
            lines.append(f"stage time (summed over threads): {stages}")
        if self.missing:
            lines.append(f"missing: {counted(len(self.missing), 'tensor')}")
        if self.unexpected:
            lines.append(f"unexpected: {counted(len(self.unexpected), 'checkpoint key')} (not loaded)")
        for name, how in sorted(self.initialized.items()):
            lines.append(terminal_text(f"initialized {name} by {how}"))
        if set(self.device_bytes) - {"cpu"}:  # (several devices, or the disk)
            per = ", ".join(f"{d} {format_bytes(n)}" for d, n in self.device_bytes.items())
            pinned = f"; pinned host staging {format_bytes(self.staging_bytes)}" \
                if self.staging_bytes else ""
            written = f"; {format_bytes(self.offload_written_bytes)} of the disk's written " \
                "(the rest read in place from the checkpoint)" if "disk" in self.device_bytes \
                else ""
            lines.append(f"on devices: {per}{pinned}{written}")
        return "\n".join(lines)


@dataclass(frozen=True)
class SaveReport:
    """What a write (save or convert) did and what it cost."""

    directory: str
    files: tuple[str, ...]
    bytes_written: int
    tensors_written: int
    seconds: float
    peak_bytes: int
    planned_peak_bytes: int
    rss_peak_bytes: int | None
    threads: int

    @property
    def gb_per_s(self) -> float:
        return self.bytes_written / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"directory": self.directory, "files": list(self.files),
                "bytes_written": self.bytes_written, "tensors_written": self.tensors_written,
                "seconds": self.seconds, "gb_per_s": self.gb_per_s, "peak_bytes": self.peak_bytes,
                "planned_peak_bytes": self.planned_peak_bytes,
                "rss_peak_bytes": self.rss_peak_bytes, "threads": self.threads}

    def __str__(self) -> str:
        from weightplan.planner.write.shards import INDEX_NAME  # (a load's report doesn't need it)
        from weightplan.terminal import terminal_text

        rss = "n/a" if self.rss_peak_bytes is None else format_bytes(self.rss_peak_bytes)
        shards = [f for f in self.files if f.endswith(".safetensors")]  # as the plan counts
        others = [("index" if f == INDEX_NAME else f) for f in self.files if f not in shards]
        files = " + ".join([counted(len(shards), "file"), *others])
        return (f"wrote {counted(self.tensors_written, 'tensor')} ({format_bytes(self.bytes_written)}) to "
                f"{terminal_text(self.directory)} in {terminal_text(files)} in {self.seconds:.2f}s "
                f"({self.gb_per_s:.2f} GB/s)\npeak held {format_bytes(self.peak_bytes)} (planned "
                f"{format_bytes(self.planned_peak_bytes)}), process peak RSS +{rss}")
