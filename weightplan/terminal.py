"""Text safe to print on a terminal: keys, paths and messages come from files, so every
control, bidi or line-breaking character in them is shown as its escape. On the ground
floor so the executor's reports and log lines use it as the viz text does."""

from __future__ import annotations

import unicodedata

# what a terminal would act on or hide rather than show: controls (Cc: ESC, CR, NUL, ...),
# format characters (Cf: bidi overrides and isolates, zero-width, tags), line and paragraph
# separators, lone surrogates (unprintable)
_UNSEEN = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def terminal_text(text: str) -> str:
    """``text`` safe to print as one line: every control, bidi, invisible or line-breaking
    character is written as its escape (``\\x1b``, ``\\n``, ``\\u202e``), so a key can't
    forge a line, erase one, retitle the terminal or reorder what is shown. Printable
    text (every ordinary key, message and path) comes back unchanged, backslashes included.

    Example:
        >>> terminal_text("z\\nproblems: none\\x1b]0;owned\\x07")
        'z\\\\nproblems: none\\\\x1b]0;owned\\\\x07'
    """
    if text.isprintable():  # one C-level pass for ordinary text
        return text
    return "".join(_escape(c) if unicodedata.category(c) in _UNSEEN else c for c in text)


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else (
        f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")


def terminal_lines(text: str) -> str:
    """Every line of ``text`` through :func:`terminal_text` (its own line breaks kept)."""
    return "\n".join(terminal_text(line) for line in text.split("\n"))
