"""Print pattern IR back to `.pdll` text that parses to an equal `PatternFile` / `Rule`.

The match DAG is printed as `let` statements for named ops (dependencies
first, the root last) with unnamed ops written inline. A value's constraints are
printed once, on its first printed occurrence (the parser gives them to every
occurrence). Alternatives are inline unless one object is reached twice; then
it gets a `let` of its own so that both uses stay one node.

IR that the language cannot express (an unnamed root, an attribute match with
neither a literal nor a binding, a non-finite float, a name that is not an
identifier) raises ValueError.
"""

from __future__ import annotations

import json
import math

from graphopt.pattern.ir import (
    MISSING,
    AltMatch,
    AttrMatch,
    Build,
    Call,
    Choose,
    Expr,
    FirstOf,
    Let,
    Lit,
    MatchNode,
    NativeDecl,
    OpMatch,
    OpsetChoose,
    OpsetGuard,
    PatternFile,
    Ref,
    Replace,
    Rule,
    ValueConstraint,
    Var,
    bound_names,
    iter_match_nodes,
)
from graphopt.pattern.pdll import is_name

__all__ = ["print_pattern_file", "print_rule", "print_native", "format_literal"]

_INDENT = "  "


def print_pattern_file(pf: PatternFile) -> str:
    """The whole file: native declarations, then each rule, separated by blank lines."""
    parts: list[str] = []
    if pf.natives:
        parts.append("".join(print_native(d) + "\n" for d in pf.natives))
    parts += [print_rule(r) for r in pf.rules]
    return "\n".join(parts)


def print_native(decl: NativeDecl) -> str:
    def typed(name: str, kind: str) -> str:
        return _name(name) if kind == "any" else f"{_name(name)}: {kind}"

    params = ", ".join(typed(p, decl.param_kind(i)) for i, p in enumerate(decl.params))
    text = f"{decl.kind} {_name(decl.name)}({params})"
    if decl.kind == "Rewrite" and decl.results:
        text += f" -> ({', '.join(typed(r, decl.result_kind(r)) for r in decl.results)})"
    elif decl.kind not in ("Constraint", "Rewrite"):
        raise ValueError(f"native kind must be Constraint or Rewrite, got {decl.kind!r}")
    return text + ";"


def print_rule(rule: Rule) -> str:
    return _RulePrinter(rule).print()


def format_literal(value: object) -> str:
    """A literal as .pdll text: ints, finite floats, strings, booleans and lists of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} cannot be written as a .pdll literal")
        return repr(value)  # shortest text that reads back as the same float, always with '.' or 'e'
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_literal(v) for v in value) + "]"
    raise ValueError(f"{value!r} cannot be written as a .pdll literal")


def _name(name: str) -> str:
    if not is_name(name):
        raise ValueError(f"{name!r} cannot be written as a name in a .pdll file")
    return name


def _op_name(domain: str, op_type: str) -> str:
    parts = (domain.split(".") if domain else []) + [op_type]
    return ".".join(_name(p) for p in parts)


class _RulePrinter:
    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.lines: list[str] = []
        self.printed_ops: set[str] = set()  # let names already emitted
        self.printed_vars: set[str] = set()  # values whose constraints were already written
        self.var_constraints = self._collect_var_constraints(rule.root)
        self.alt_names = self._name_shared_alts(rule)
        self.printed_alts: set[int] = set()

    # -------------------------------------------------------------- setup
    @staticmethod
    def _collect_var_constraints(root: OpMatch) -> dict[str, list[ValueConstraint]]:
        merged: dict[str, list[ValueConstraint]] = {}
        for n in iter_match_nodes(root):
            if isinstance(n, Var) and n.name != "_":
                cs = merged.setdefault(n.name, [])
                cs += [c for c in n.constraints if c not in cs]
        return merged

    @staticmethod
    def _name_shared_alts(rule: Rule) -> dict[int, str]:
        """A let name for each AltMatch object reached more than once while printing."""
        counts: dict[int, int] = {}
        alts: dict[int, AltMatch] = {}
        seen_named: set[str] = set()
        stack: list[MatchNode] = [rule.root]
        while stack:  # walks like the printer does: named ops once, everything else per use
            n = stack.pop()
            if isinstance(n, OpMatch):
                if n.name is not None:
                    if n.name in seen_named:
                        continue
                    seen_named.add(n.name)
                stack.extend(n.operands)
            elif isinstance(n, AltMatch):
                counts[id(n)] = counts.get(id(n), 0) + 1
                alts[id(n)] = n
                if counts[id(n)] == 1:
                    stack.extend(b for _, b in n.branches)
        taken = bound_names(rule.root) | {s.name for s in rule.body if isinstance(s, Let)}
        names: dict[int, str] = {}
        for key, count in counts.items():
            if count > 1:
                base = f"{alts[key].tag_var}_alt"
                name, i = base, 2
                while name in taken:
                    name, i = f"{base}{i}", i + 1
                taken.add(name)
                names[key] = name
        return names

    # -------------------------------------------------------------- rule
    def print(self) -> str:
        rule = self.rule
        out = [f"/// {line}".rstrip() for line in rule.doc.split("\n")] if rule.doc else []
        benefit = f" with benefit({rule.benefit})" if rule.benefit is not None else ""
        out.append(f"Pattern {_name(rule.name)}{benefit} {{")
        if rule.root.name is None:
            raise ValueError(f"rule {rule.name}: the root op must have a let name")
        self.use_match(rule.root)
        out += [_INDENT + line for line in self.lines]
        out += [_INDENT + f"where {_opset_of(g.domain)} {_opset_cmp(g)};" for g in rule.guards]
        out += [_INDENT + f"{self.call(c)};" for c in rule.constraints]
        body = rule.body
        if len(body) == 1 and isinstance(body[0], Replace) and body[0].target == rule.root.name:
            out.append(_INDENT + self.replace(body[0]))
        else:
            out.append(_INDENT + f"rewrite {_name(rule.root.name)} with {{")
            for s in body:
                text = f"let {_name(s.name)} = {self.expr(s.expr)};" if isinstance(s, Let) else self.replace(s)
                out.append(_INDENT * 2 + text)
            out.append(_INDENT + "};")
        out.append("}")
        return "\n".join(out) + "\n"

    # -------------------------------------------------------------- match half
    def use_match(self, node: MatchNode) -> str:
        """Text for `node` where it is used; emits its `let` first if it has one."""
        if isinstance(node, OpMatch) and node.name is not None:
            if node.name not in self.printed_ops:
                self.printed_ops.add(node.name)
                text = self.inline_op(node)
                self.lines.append(f"let {_name(node.name)} = {text};")
            return node.name
        if isinstance(node, AltMatch) and id(node) in self.alt_names:
            name = self.alt_names[id(node)]
            if id(node) not in self.printed_alts:
                self.printed_alts.add(id(node))
                self.lines.append(f"let {name} = {self.inline_alt(node)};")
            return name
        if isinstance(node, OpMatch):
            return self.inline_op(node)
        if isinstance(node, AltMatch):
            return self.inline_alt(node)
        return self.var(node)

    def inline_op(self, node: OpMatch) -> str:
        types = "|".join(_op_name(d, t) for d, t in node.keys)
        if node.type_bind is not None:
            types = f"{_name(node.type_bind)}: {types}"
        text = ("shared " if node.shared else "") + f"op<{types}>(" + ", ".join(self.use_match(o) for o in node.operands) + ")"
        if node.attrs:
            text += " {" + ", ".join(self.match_attr(a) for a in node.attrs) + "}"
        if node.output:
            text += f"[{node.output}]"
        return text

    def inline_alt(self, node: AltMatch) -> str:
        branches = ", ".join(f"{_name(tag)}: {self.use_match(b)}" for tag, b in node.branches)
        return f"alt {_name(node.tag_var)} {{{branches}}}"

    def var(self, v: Var) -> str:
        text = v.name if v.name == "_" else _name(v.name)
        if v.optional:
            text += "?"
        constraints: list[ValueConstraint] = list(v.constraints)
        if v.name != "_":
            constraints = [] if v.name in self.printed_vars else self.var_constraints.get(v.name, [])
            self.printed_vars.add(v.name)
        if len(constraints) == 1:
            text += ": " + self.constraint(constraints[0])
        elif constraints:
            text += ": [" + ", ".join(self.constraint(c) for c in constraints) + "]"
        return text

    @staticmethod
    def constraint(c: ValueConstraint) -> str:
        if not c.args:
            return _name(c.kind)
        args = [a if isinstance(a, str) and is_name(a) else format_literal(a) for a in c.args]
        return f"{_name(c.kind)}<{', '.join(args)}>"

    @staticmethod
    def match_attr(a: AttrMatch) -> str:
        if (a.bind is None) == (a.literal is MISSING):
            raise ValueError(f"attribute match {a.name!r} needs exactly one of a literal or a binding to be printed")
        value = _name(a.bind) if a.bind is not None else format_literal(a.literal)
        text = f"{_name(a.name)} = {value}"
        if a.default is not MISSING:
            text += f" default {format_literal(a.default)}"
        return text

    # -------------------------------------------------------------- rewrite half
    def replace(self, r: Replace) -> str:
        if not r.values:
            raise ValueError(f"replace of {r.target!r} has no values")
        values = self.expr(r.values[0]) if len(r.values) == 1 else "(" + ", ".join(self.expr(v) for v in r.values) + ")"
        return f"replace {_name(r.target)} with {values};"

    def call(self, c: Call) -> str:
        return f"{_name(c.name)}(" + ", ".join(self.expr(a) for a in c.args) + ")"

    def expr(self, e: Expr | None) -> str:
        if e is None:
            return "_"
        if isinstance(e, Ref):
            field = None if e.field is None else e.field if e.field.isdigit() else _name(e.field)
            return _name(e.name) + (f".{field}" if field is not None else "")
        if isinstance(e, Lit):
            return format_literal(e.value)
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, Build):
            head = (_name(e.type_ref) if e.type_ref is not None else _op_name(e.domain, e.op_type)) + (f", {e.num_outputs}" if e.num_outputs != 1 else "")
            text = f"op<{head}>(" + ", ".join(self.expr(o) for o in e.operands) + ")"
            attrs = ([f"..{_name(e.copy_from)}"] if e.copy_from is not None else []) + [f"{_name(k)} = {self.expr(v)}" for k, v in e.attrs]
            if attrs:
                text += " {" + ", ".join(attrs) + "}"
            return text
        if isinstance(e, Choose):
            branches = ", ".join(f"{_name(label)}: {self.expr(v)}" for label, v in e.branches)
            return f"alt {self.expr(e.tag)} {{ {branches} }}"
        if isinstance(e, FirstOf):
            return "first { " + ", ".join(self.expr(o) for o in e.options) + " }"
        if isinstance(e, OpsetChoose):
            branches = ", ".join(f"{_opset_cmp(g)}: {self.expr(v)}" for g, v in e.branches)
            return f"alt {_opset_of(e.domain)} {{ {branches} }}"
        raise ValueError(f"not an expression: {e!r}")


def _opset_of(domain: str) -> str:
    return f"opset({'.'.join(_name(p) for p in domain.split('.'))})" if domain else "opset"


def _opset_cmp(g: OpsetGuard) -> str:
    """`>= 20`: a range as one comparison (a two-sided range only as `==`)."""
    if g.low is not None and g.high is not None:
        if g.low != g.high:
            raise ValueError(f"opset range {g.low}..{g.high} is written as two `where` guards, not one")
        return f"== {g.low}"
    if g.low is not None:
        return f">= {g.low}"
    if g.high is not None:
        return f"<= {g.high}"
    raise ValueError("an opset guard needs a bound")
