"""transformers' pattern dialect → weightplan's (facts: transformers 5.x ``WeightTransform``).

transformers compiles a source pattern by replacing every ``*.`` with ``.*\\.`` and, when
the pattern ends with a letter or digit, appending ``(?!\\w)`` (a name boundary:
``gate_proj.weight`` does not match ``gate_proj.weight_scale_inv``). Targets lose a
leading ``^``, lookaround groups and ``\\.`` escapes, and their first capturing group
becomes ``\\1``.

weightplan reads a ``*`` that is a whole key component (``experts.*.w1``) as the index
wildcard (one numeric component, collected in numeric order): that is what those
transformers patterns are for, so it is kept. A ``*.`` that is not a whole component
(``shard_*.weight``, a leading ``*.``) means "anything" in transformers and becomes
``(?:.*)\\.`` here. The name boundary is appended as transformers does.
"""

from __future__ import annotations

import re

from weightplan.errors import PatternError

_LOOKAROUND = re.compile(r"\(\?.+?\)?\)")
_GROUP = re.compile(r"\(.+?\)")


def source_pattern(text: str) -> str:
    """A transformers source pattern as a weightplan source pattern (same keys match)."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            out.append(text[i:i + 2])
            i += 2
            continue
        if c == "*" and text[i + 1:i + 2] == ".":
            whole = i > 0 and text[i - 1] == "."
            out.append("*." if whole else r"(?:.*)\.")
            i += 2
            continue
        out.append(c)
        i += 1
    body = "".join(out)
    return body + r"(?!\w)" if re.search(r"[a-zA-Z0-9]$", body) else body


def target_pattern(text: str) -> tuple[str, str | None]:
    """A transformers target as a weightplan target, and the group text it captured.

    Raises:
        PatternError: what is left is still not a literal key fragment.
    """
    body = text[1:] if text.startswith("^") else text
    body = _LOOKAROUND.sub("", body)
    group = _GROUP.search(body)
    captured = None
    if group is not None:
        captured = group.group(0)
        body = body.replace(captured, r"\1", 1)
    if any(c in body for c in "()[]{}?+|"):
        raise PatternError(f"target {text!r} is a regex, not a key fragment")
    return body, captured


def with_group(source: str, captured: str | None) -> str:
    """transformers fills a ``\\1`` in a *source* with the group its targets captured."""
    if "\\1" not in source:
        return source
    if captured is None:
        raise PatternError(f"source {source!r} uses \\1 but no target captures a group")
    return source.replace("\\1", captured, 1)
