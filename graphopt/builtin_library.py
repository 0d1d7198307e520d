"""Where graphopt's own rule library lives: `graphopt/_patterns` in an installed wheel,
`patterns/` beside the package in a source checkout. A leaf module, so that the driver
(which tells built-in rules from the user's) and the API can both ask it."""

from __future__ import annotations

from pathlib import Path

__all__ = ["BUILTIN_PATTERNS_DIR"]


def _builtin_patterns_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "_patterns", here.parent / "patterns"):  # installed wheel, then source tree
        if candidate.is_dir():
            return candidate
    return here.parent / "patterns"


BUILTIN_PATTERNS_DIR = _builtin_patterns_dir()
