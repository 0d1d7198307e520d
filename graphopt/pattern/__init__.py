"""The pattern language: the frozen pattern IR, the `.pdll` parser, the embedded
Python form (`graphopt.pattern.python`), the printer and the loader."""

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
from graphopt.pattern.loader import load_patterns
from graphopt.pattern.pdll import parse_pdll, parse_pdll_file
from graphopt.pattern.printer import print_pattern_file, print_rule

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
