"""The pattern language: the frozen pattern IR, the `.pdll` parser, the embedded
Python form (`graphopt.pattern.python`), the printer and the loader."""

import importlib
from typing import TYPE_CHECKING, Any

from graphopt.pattern.ir import (
    MISSING,
    AltMatch,
    AttrMatch,
    Build,
    Call,
    Let,
    Lit,
    NativeDecl,
    OpMatch,
    PatternFile,
    Ref,
    Replace,
    Rule,
    SourceLoc,
    ValueConstraint,
    Var,
)

if TYPE_CHECKING:
    from graphopt.pattern.loader import load_patterns
    from graphopt.pattern.pdll import parse_pdll, parse_pdll_file
    from graphopt.pattern.printer import print_pattern_file, print_rule

# Imported on first use: the op registry needs only the IR, and the parser's lark only
# when a .pdll file is not in the cache.
_LAZY = {
    "load_patterns": "graphopt.pattern.loader",
    "parse_pdll": "graphopt.pattern.pdll",
    "parse_pdll_file": "graphopt.pattern.pdll",
    "print_pattern_file": "graphopt.pattern.printer",
    "print_rule": "graphopt.pattern.printer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'graphopt.pattern' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "load_patterns",
    "parse_pdll",
    "parse_pdll_file",
    "print_pattern_file",
    "print_rule",
    "MISSING",
    "AltMatch",
    "AttrMatch",
    "Build",
    "Call",
    "Let",
    "Lit",
    "NativeDecl",
    "OpMatch",
    "PatternFile",
    "Ref",
    "Replace",
    "Rule",
    "SourceLoc",
    "ValueConstraint",
    "Var",
]
