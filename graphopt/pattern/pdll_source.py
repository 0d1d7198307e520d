"""Names, source positions and error messages of `.pdll` text, shared by its parser and builders.

What counts as a name (`is_name`, `RESERVED_WORDS`), whether a value constraint is well
formed (`check_value_constraint`), and `format_error`, which makes every problem a
`PatternError` reading `file:line:col: message` with the source line and a caret; plus
the small helpers that turn lark's tokens and trees into line:col positions.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, TypeAlias

from graphopt.errors import PatternError
from graphopt.pattern.ir import VALUE_CONSTRAINTS, SourceLoc

if TYPE_CHECKING:  # lark is imported only to parse: loading cached rules needs none of it
    from lark import Token, Tree

__all__ = ["RESERVED_WORDS", "is_name", "check_value_constraint", "format_error"]

#: Words with a meaning in the grammar; they cannot name values, ops, rules or natives.
RESERVED_WORDS: frozenset[str] = frozenset(
    {"Pattern", "Constraint", "Rewrite", "rewrite", "replace", "let", "op", "alt", "shared", "with", "benefit", "default", "true", "false",
     "where", "opset", "first"}
)

_NAME_RE = re.compile(r"[^\W\d]\w*")


def is_name(text: str) -> bool:
    """True if `text` can be written as a name in a .pdll file."""
    return bool(_NAME_RE.fullmatch(text)) and text not in RESERVED_WORDS


def check_value_constraint(kind: str, args: tuple[object, ...]) -> str | None:
    """Why `kind<args>` is not a valid value constraint, or None if it is."""
    if kind not in VALUE_CONSTRAINTS:
        return f"unknown value constraint '{kind}' (known: {', '.join(VALUE_CONSTRAINTS)})"
    arity = VALUE_CONSTRAINTS[kind]
    if arity is None and not args:
        return f"{kind} needs at least one argument, like {kind}<...>"
    if arity is not None and len(args) != arity:
        return f"{kind} takes {arity} argument{'s' if arity != 1 else ''}, got {len(args)}"
    if kind == "Rank" and not all(isinstance(a, int) and not isinstance(a, bool) and a >= 0 for a in args):
        return "Rank takes a non-negative integer, like Rank<4>"
    if kind == "DType" and not all(isinstance(a, str) for a in args):
        return "DType takes element type names, like DType<f16, bf16>"
    return None


def format_error(path: str, text: str, line: int, col: int, message: str) -> PatternError:
    """A PatternError: `file:line:col: message`, then the source line and a caret under col."""
    lines = text.split("\n")
    source = lines[line - 1].rstrip("\r") if 0 < line <= len(lines) else ""
    # Keep tabs so the caret lines up with the source as a terminal shows it.
    caret = "".join(c if c == "\t" else " " for c in source[: col - 1]) + "^"
    return PatternError(f"{path}:{line}:{col}: {message}\n  {source}\n  {caret}")



_Pos: TypeAlias = "Token | Tree"


def _line_col(at: _Pos) -> tuple[int, int]:
    if isinstance(at, str):  # a Token (lark's tokens are strs)
        return at.line or 1, at.column or 1
    meta = at.meta
    return (getattr(meta, "line", 1), getattr(meta, "column", 1)) if not meta.empty else (1, 1)


def _at(loc: SourceLoc | None) -> str:
    """line:col of a location in the file being parsed."""
    return f"{loc.line}:{loc.col}" if loc is not None else "?"


def _present(children: list) -> list:
    """Children without maybe_placeholders' Nones for absent `[...]` parts."""
    return [c for c in children if c is not None]

