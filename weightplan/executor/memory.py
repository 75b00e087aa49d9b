"""Memory accounting: bytes the executor holds, and the OS's view of resident memory."""

from __future__ import annotations

import threading


class Tracker:
    """Bytes held right now and at most, counted by the executor (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.now += nbytes
            self.peak = max(self.peak, self.now)

    def sub(self, nbytes: int) -> None:
        with self._lock:
            self.now -= nbytes


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class RssMeter:
    """Peak resident-set growth over a region of code (Linux; ``None`` elsewhere)."""

    def __init__(self) -> None:
        self.start_rss = _status_kib("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
            self.enabled = self.start_rss is not None
        except OSError:
            self.enabled = False

    def peak_growth(self) -> int | None:
        if not self.enabled:
            return None
        hwm = _status_kib("VmHWM")
        if hwm is None or self.start_rss is None:
            return None
        return max(0, hwm - self.start_rss)
