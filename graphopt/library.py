"""Where the built-in pattern library lives, and how source locations are shown to people.

Rules carry `file:line:col` locations with absolute paths (tools open them). People read
them shorter: a built-in rule as `rules/conv_bn.pdll:14:1` (relative to the library,
wherever pip put it), a file under the current folder relative to it, others as given.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["BUILTIN_RULES_DIR", "display_source"]


def _builtin_rules_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "_rules", here.parent / "rules"):  # installed wheel, then source tree
        if candidate.is_dir():
            return candidate
    return here.parent / "rules"


BUILTIN_RULES_DIR = _builtin_rules_dir()


def display_source(location: object) -> str:
    """`file:line[:col]` as people read it (see the module's doc); "?" when unknown."""
    text = str(location or "")
    if not text:
        return "?"
    path, sep, rest = text.partition(":")
    if os.name == "nt" and len(path) == 1 and rest:  # a drive letter: C:\\...
        more, sep, rest = rest.partition(":")
        path = f"{path}:{more}"
    try:
        absolute = Path(path).resolve()
        if absolute.is_relative_to(BUILTIN_RULES_DIR):
            shown = "rules/" + absolute.relative_to(BUILTIN_RULES_DIR).as_posix()
        else:
            relative = os.path.relpath(absolute)
            shown = relative if not relative.startswith("..") else path
    except (OSError, ValueError):
        shown = path
    return f"{shown}{sep}{rest}"
