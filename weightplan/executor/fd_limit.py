"""Running out of file descriptors, said plainly.

A load keeps every checkpoint file open for its whole run (for the read leases and the
fingerprint checks after the last read), and a save every shard it writes. A checkpoint of
more files than the process may open (300 shards under ``ulimit -n 256``) used to fail
as "the file changed"; it is an error that says the limit and how to raise it.
"""

from __future__ import annotations

import errno

try:
    import resource
except ImportError:  # not POSIX
    resource = None  # type: ignore[assignment]


def out_of_descriptors(error: BaseException | None) -> bool:
    """Whether ``error`` is EMFILE (this process's limit) or ENFILE (the system's)."""
    return isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE)


def limit_hint(error: OSError, files: int, what: str) -> str:
    """Why ``files`` files can't all be open at once, and how to raise the limit."""
    if error.errno == errno.ENFILE:
        return (f"the system's table of open files is full ({what} holds {files} files open "
                "at once); close other programs or raise fs.file-max, then try again")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE) if resource else (None, None)
    wanted = max(4096, 2 * files)
    if hard is not None and hard != getattr(resource, "RLIM_INFINITY", -1):
        wanted = min(wanted, hard)
    return (f"{what} holds all its {files} files open at once, and this process may have "
            f"{soft} files open (ulimit -n; hard limit {hard}); raise it with `ulimit -n "
            f"{wanted}` in the shell, or resource.setrlimit(resource.RLIMIT_NOFILE, ({wanted}, "
            f"{hard})) in Python, and try again")
