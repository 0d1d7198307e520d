"""The `.pdll` front end's second half: lark's parse tree -> pattern IR, with every check
that needs names (definitions, uses, kinds of natives), each a `PatternError` at
file:line:col. This module builds the file (native declarations, literals, one rule per
`Pattern`, duplicate checks); graphopt.pattern.pdll_rule_build builds each rule, and
graphopt.pattern.pdll_source holds the names, positions and error format they share.

Two conventions the IR does not spell out:

* A constraint written on a value (`w: Const`) restricts the value, not one
  operand slot: every occurrence of `w` in the rule carries the union of the
  constraints written on any occurrence, so the matcher may check them at
  whichever occurrence it binds first. `?` (optional) stays per occurrence.
* `Rule.natives` holds the declarations of the natives the rule calls; a call to
  an undeclared native gets a synthesized declaration located at the call, so
  the loader can report an unregistered helper at a useful place.
"""

from __future__ import annotations

import json
import math

from lark import Token, Tree

from graphopt.errors import PatternError
from graphopt.pattern.ir import NATIVE_KINDS, NativeDecl, PatternFile, Rule, SourceLoc
from graphopt.pattern.pdll_rule_build import _PatternBuilder
from graphopt.pattern.pdll_source import RESERVED_WORDS, _at, _line_col, _Pos, _present, format_error

__all__ = ["FileBuilder"]


class FileBuilder:
    def __init__(self, text: str, path: str) -> None:
        self.text = text
        self.path = path
        self.lines = text.split("\n")
        self.decls: dict[tuple[str, str], NativeDecl] = {}

    # -------------------------------------------------------------- helpers
    def error(self, at: _Pos, message: str) -> PatternError:
        line, col = _line_col(at)
        return format_error(self.path, self.text, line, col, message)

    def loc(self, at: _Pos) -> SourceLoc:
        line, col = _line_col(at)
        return SourceLoc(self.path, line, col)

    def check_name(self, tok: Token | Tree, what: str) -> str:
        name = str(tok)
        if name in RESERVED_WORDS:
            raise self.error(tok, f"'{name}' is a reserved word and cannot be used as {what}")
        return name

    def doc_above(self, line: int) -> str:
        """The `///` comment lines directly above `line`, joined with newlines."""
        docs: list[str] = []
        i = line - 2
        while i >= 0 and self.lines[i].strip().startswith("///"):
            docs.append(self.lines[i].strip()[3:].strip())
            i -= 1
        return "\n".join(reversed(docs))

    # -------------------------------------------------------------- file
    def build(self, tree: Tree) -> PatternFile:
        natives: list[NativeDecl] = []
        # Declarations first, so a pattern may call a native declared further down.
        for item in tree.children:
            if item.data in ("constraint_decl", "rewrite_decl"):
                decl = self.native_decl(item)
                key = (decl.kind, decl.name)
                if key in self.decls:
                    raise self.error(item.children[1], f"{decl.kind} '{decl.name}' is already declared at {_at(self.decls[key].loc)}")
                self.decls[key] = decl
                natives.append(decl)
        rules: list[Rule] = []
        seen: dict[str, Rule] = {}
        for item in tree.children:
            if item.data == "pattern":
                rule = _PatternBuilder(self, item).build()
                if rule.name in seen:
                    raise self.error(item.children[1], f"pattern '{rule.name}' is already defined at {_at(seen[rule.name].loc)}")
                seen[rule.name] = rule
                rules.append(rule)
        return PatternFile(self.path, tuple(natives), tuple(rules))

    def native_decl(self, t: Tree) -> NativeDecl:
        kw, name_tok, *rest = t.children
        kind = "Constraint" if t.data == "constraint_decl" else "Rewrite"
        results: tuple[str, ...] = ()
        result_kinds: tuple[str, ...] = ()
        if kind == "Rewrite":
            *rest, results_tree = rest
            if results_tree is not None:
                items = [r if isinstance(r, Tree) else Tree("param", [r, None]) for r in _present(results_tree.children)]
                results = tuple(self.check_name(r.children[0], "a result name") for r in items)
                result_kinds = tuple(self.native_kind(r) for r in items)
                if len(set(results)) != len(results):
                    raise self.error(results_tree, f"{kind} '{name_tok}' has a repeated result name")
        present = _present(rest)
        params = tuple(self.check_name(p.children[0], "a parameter name") for p in present)
        param_kinds = tuple(self.native_kind(p) for p in present)
        return NativeDecl(
            kind, self.check_name(name_tok, "a native name"), params, results, self.loc(kw),
            param_kinds if any(k != "any" for k in param_kinds) else (),
            result_kinds if any(k != "any" for k in result_kinds) else (),
        )

    def native_kind(self, param: Tree) -> str:
        kind_tok = param.children[1]
        if kind_tok is None:
            return "any"
        kind = {"op": "value"}.get(str(kind_tok).lower(), str(kind_tok).lower())  # PDLL spells them Value, Attr, Op
        if kind not in NATIVE_KINDS:
            raise self.error(kind_tok, f"unknown kind '{kind_tok}' (known: {', '.join(sorted(NATIVE_KINDS))})")
        return kind

    # -------------------------------------------------------------- literals
    def literal(self, t: Token | Tree) -> object:
        if isinstance(t, Tree):  # list
            return [self.literal(c) for c in _present(t.children)]
        if t.type == "INT":
            try:
                return int(t)
            except ValueError:  # more digits than Python converts
                raise self.error(t, "integer literal is too long") from None
        if t.type == "FLOAT":
            value = float(t)
            if not math.isfinite(value):
                raise self.error(t, f"number {t} is out of range")
            return value
        if t.type == "STRING":
            return json.loads(t)
        if t.type in ("TRUE", "FALSE"):
            return t.type == "TRUE"
        raise self.error(t, f"expected a literal, got '{t}'")

    def small_int(self, tok: Token | Tree, what: str, minimum: int) -> int:
        value = self.literal(tok)
        assert isinstance(value, int)  # the grammar only puts INT tokens here
        if value < minimum:
            raise self.error(tok, f"{what} must be at least {minimum}, got {value}")
        return value


