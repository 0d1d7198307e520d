"""The `.pdll` front end, one rule at a time: a `Pattern`'s parse tree -> one `Rule`, with every name check.

`_PatternBuilder` walks a pattern's statements in source order: the match half (`let`s of
ops and alternatives, operands with their value constraints, attribute bindings, opset
guards, constraint calls) and then the rewrite half (lets, replaces, new ops, native
Rewrite calls, `alt` / `first` choices), resolving every name against what was defined
before it and checking what kind of thing it is, each problem a `PatternError` at
file:line:col. graphopt.pattern.pdll_build drives it once per pattern of a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lark import Token, Tree

from graphopt.errors import PatternError
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
    Ref,
    Replace,
    Rule,
    Statement,
    ValueConstraint,
    Var,
    iter_match_nodes,
)
from graphopt.pattern.pdll_source import _at, _line_col, _Pos, _present, check_value_constraint

if TYPE_CHECKING:
    from graphopt.pattern.pdll_build import FileBuilder

@dataclass
class _Name:
    """What a name in one pattern stands for, and where it was first defined."""

    kind: str  # "value", "op", "alt", "attr", "tag" (match half) or "let" (rewrite half)
    line: int
    col: int
    node: object = None  # the OpMatch / AltMatch / Expr the name is bound to

    def describe(self) -> str:
        what = {
            "value": "a value",
            "op": "a let-bound op",
            "alt": "a let-bound alternative",
            "attr": "an attribute binding",
            "tag": "an alternative tag",
            "type": "an op type binding",
            "let": "a rewrite let",
        }[self.kind]
        return f"{what} (defined at {self.line}:{self.col})"


class _PatternBuilder:
    """Builds one `Rule` from one `pattern` tree, statement by statement."""

    def __init__(self, file: FileBuilder, tree: Tree) -> None:
        self.f = file
        self.tree = tree
        self.names: dict[str, _Name] = {}
        self.lets: list[tuple[_Name, Token | Tree]] = []  # let-bound ops and alts, for the reachability check
        self.var_constraints: dict[str, tuple[ValueConstraint, ...]] = {}
        self.used_natives: dict[tuple[str, str], NativeDecl] = {}
        self.tag_labels: dict[str, list[str]] = {}  # alternative tag -> its branch labels

    def error(self, at: _Pos, message: str) -> PatternError:
        return self.f.error(at, message)

    def build(self) -> Rule:
        kw, name_tok, benefit_tree, *stmts = self.tree.children
        name = self.f.check_name(name_tok, "a pattern name")
        benefit = None if benefit_tree is None else self.f.small_int(benefit_tree.children[0], "benefit", 0)
        self.collect_var_constraints(stmts)

        root: OpMatch | None = None
        body: tuple[Statement, ...] | None = None
        constraints: list[Call] = []
        guards: list[OpsetGuard] = []
        for st in stmts:
            if body is not None:
                raise self.error(st, "the rewrite must be the last statement of a pattern")
            if st.data == "match_let":
                self.match_let(st)
            elif st.data == "guard":
                _, opset_tree, cmp_tok, version_tok = st.children
                guards.append(self.opset_range(opset_tree, cmp_tok, version_tok))
            elif st.data == "constraint_call":
                constraints.append(self.call(st.children[0], "Constraint"))
            elif st.data == "rewrite_block":
                root = self.root(st.children[1])
                body = self.rewrite_block(st)
            else:  # replace_stmt: the shorthand for a rewrite that only replaces the root
                root = self.root(st.children[1])
                body = (self.replace_stmt(st),)
        if root is None or body is None:
            raise self.error(
                name_tok, f"pattern '{name}' has no rewrite: end it with `replace ROOT with ...;` or `rewrite ROOT with {{...}};`"
            )
        self.check_reachable(root)
        return Rule(
            name=name,
            root=root,
            body=body,
            constraints=tuple(constraints),
            benefit=benefit,
            doc=self.f.doc_above(_line_col(kw)[0]),
            loc=self.f.loc(kw),
            guards=tuple(guards),
            natives=tuple(self.used_natives.values()),
        )

    def opset_range(self, opset_tree: Tree, cmp_tok: Token | Tree, version_tok: Token | Tree) -> OpsetGuard:
        """`opset >= 20` / `opset(com.microsoft) < 2` as an inclusive range."""
        domain = "" if opset_tree.children[1] is None else ".".join(str(p) for p in opset_tree.children[1].children)
        version = self.f.small_int(version_tok, "an opset version", 1)
        cmp = str(cmp_tok)
        low, high = {
            ">=": (version, None), ">": (version + 1, None), "<=": (None, version), "<": (None, version - 1), "==": (version, version),
        }[cmp]
        return OpsetGuard("" if domain == "ai.onnx" else domain, low, high)

    # -------------------------------------------------------------- names
    def define(self, tok: Token | Tree, kind: str, node: object = None, what: str = "a name") -> _Name:
        name = self.f.check_name(tok, what)
        if name == "_":
            raise self.error(tok, f"'_' is the wildcard and cannot be used as {what}")
        known = self.names.get(name)
        if known is not None:
            if known.kind == "value" and kind in ("op", "alt"):
                raise self.error(tok, f"'{name}' is used at {known.line}:{known.col} before this let defines it; move the let up")
            raise self.error(tok, f"'{name}' is already defined as {known.describe()}")
        entry = _Name(kind, *_line_col(tok), node)
        self.names[name] = entry
        return entry

    def root(self, tok: Token | Tree) -> OpMatch:
        known = self.names.get(str(tok))
        if known is None:
            raise self.error(tok, f"unknown name '{tok}': the root must be a let-bound op")
        if known.kind != "op":
            raise self.error(tok, f"the root '{tok}' must be a let-bound op, but it is {known.describe()}")
        assert isinstance(known.node, OpMatch)
        return known.node

    def check_reachable(self, root: OpMatch) -> None:
        reachable = {id(n) for n in iter_match_nodes(root)}
        for entry, tok in self.lets:
            if id(entry.node) not in reachable:
                raise self.error(tok, f"'{tok}' is not connected to the root '{root.name}'; every matched op must feed the root")

    # -------------------------------------------------------------- match half
    def collect_var_constraints(self, stmts: list[Tree]) -> None:
        """Pass 1: the constraints written on each named value, anywhere in the match."""
        for st in stmts:
            if st.data != "match_let":
                continue
            for t in st.iter_subtrees_topdown():
                if t.data == "var_operand" and t.children[2] is not None and str(t.children[0]) != "_":
                    name = str(t.children[0])
                    merged = list(self.var_constraints.get(name, ()))
                    merged += [c for c in self.constraints(t.children[2]) if c not in merged]
                    self.var_constraints[name] = tuple(merged)

    def constraints(self, t: Tree) -> tuple[ValueConstraint, ...]:
        out: list[ValueConstraint] = []
        for c in t.children:
            kind_tok, *arg_toks = _present(c.children)
            args = tuple(str(a) if a.type == "NAME" else self.f.literal(a) for a in arg_toks)
            problem = check_value_constraint(str(kind_tok), args)
            if problem:
                raise self.error(kind_tok, problem)
            out.append(ValueConstraint(str(kind_tok), args))
        return tuple(out)

    def match_let(self, st: Tree) -> None:
        _, name_tok, value = st.children
        if value.data == "op_match":
            node: MatchNode = self.op_match(value, name=str(name_tok))
            entry = self.define(name_tok, "op", node, "a let name")
        else:
            node = self.alt_match(value)
            entry = self.define(name_tok, "alt", node, "a let name")
        self.lets.append((entry, name_tok))

    def operand(self, t: Tree) -> MatchNode:
        if t.data == "var_operand":
            return self.var_operand(t)
        if t.data == "op_match":
            return self.op_match(t)
        return self.alt_match(t)

    def var_operand(self, t: Tree) -> MatchNode:
        name_tok, opt_tok, cons_tree = t.children
        name = str(name_tok)
        optional = opt_tok is not None
        if name == "_":
            return Var("_", self.constraints(cons_tree) if cons_tree is not None else (), optional)
        self.f.check_name(name_tok, "a value name")
        known = self.names.get(name)
        if known is None:
            self.names[name] = _Name("value", *_line_col(name_tok))
        elif known.kind in ("op", "alt"):
            if optional or cons_tree is not None:
                raise self.error(name_tok, f"'{name}' is {known.describe()}; '?' and constraints can only be written on values")
            return known.node  # type: ignore[return-value]  # the same object: the pattern is a DAG
        elif known.kind != "value":
            raise self.error(name_tok, f"'{name}' is {known.describe()} and cannot be used as an operand")
        return Var(name, self.var_constraints.get(name, ()), optional)

    def op_match(self, t: Tree, name: str | None = None) -> OpMatch:
        shared_tok, children = t.children[0], t.children[1:]
        bind_tree, types_tree = children[1], children[2]
        keys: list[tuple[str, str]] = []
        for name_tree in types_tree.children:
            key = self.op_name(name_tree)
            if key in keys:
                raise self.error(name_tree, f"op type '{'.'.join(str(p) for p in name_tree.children)}' is listed twice")
            keys.append(key)
        type_bind = None
        if bind_tree is not None:
            type_bind = str(bind_tree.children[0])
            self.define(bind_tree.children[0], "type", what="an op type binding")
            self.tag_labels[type_bind] = [op_type for _, op_type in keys]  # `alt kind { Relu: ..., Tanh: ... }`
        operands = tuple(self.operand(o) for o in _present(children[3:-2]))
        attrs_tree, output_tree = children[-2], children[-1]
        attrs = self.match_attrs(attrs_tree) if attrs_tree is not None else ()
        output = 0 if output_tree is None else self.f.small_int(output_tree.children[0], "output index", 0)
        (domain, op_type), *others = keys
        return OpMatch(op_type, domain, operands, attrs, name, output, shared=shared_tok is not None, alternatives=tuple(others), type_bind=type_bind)

    def op_name(self, t: Tree) -> tuple[str, str]:
        parts = [str(p) for p in t.children]
        return ".".join(parts[:-1]), parts[-1]

    def match_attrs(self, t: Tree) -> tuple[AttrMatch, ...]:
        out: list[AttrMatch] = []
        for a in _present(t.children):
            name_tok, value, default_kw, default = a.children
            if any(m.name == str(name_tok) for m in out):
                raise self.error(name_tok, f"attribute '{name_tok}' is matched twice")
            literal: object = MISSING
            bind: str | None = None
            if isinstance(value, Token) and value.type == "NAME":
                bind = self.attr_bind(value)
            else:
                literal = self.f.literal(value)
            out.append(AttrMatch(str(name_tok), literal, bind, MISSING if default_kw is None else self.f.literal(default)))
        return tuple(out)

    def attr_bind(self, tok: Token) -> str:
        name = self.f.check_name(tok, "an attribute binding")
        known = self.names.get(name)
        if known is None:
            self.define(tok, "attr", what="an attribute binding")
        elif known.kind != "attr":  # the same attribute name twice means "equal values"
            raise self.error(tok, f"'{name}' is {known.describe()}; an attribute binding needs a name of its own")
        return name

    def alt_match(self, t: Tree) -> AltMatch:
        _, tag_tok, *branches = _present(t.children)
        self.define(tag_tok, "tag", what="an alternative tag")
        out: list[tuple[str, MatchNode]] = []
        for b in branches:
            label_tok, value = b.children
            label = self.f.check_name(label_tok, "a branch label")
            if any(label == existing for existing, _ in out):
                raise self.error(label_tok, f"branch '{label}' appears twice in alternatives '{tag_tok}'")
            out.append((label, self.operand(value)))
        self.tag_labels[str(tag_tok)] = [label for label, _ in out]
        return AltMatch(str(tag_tok), tuple(out))

    # -------------------------------------------------------------- rewrite half
    def rewrite_block(self, st: Tree) -> tuple[Statement, ...]:
        kw, _, *stmts = _present(st.children)
        body: list[Statement] = []
        for s in stmts:
            if s.data == "rewrite_let":
                _, name_tok, value = s.children
                expr = self.value(value, "Rewrite")
                self.define(name_tok, "let", expr, "a let name")
                body.append(Let(str(name_tok), expr))
            else:
                body.append(self.replace_stmt(s))
        if not any(isinstance(s, Replace) for s in body):
            raise self.error(kw, "the rewrite block has no `replace ... with ...;`")
        return tuple(body)

    def replace_stmt(self, st: Tree) -> Replace:
        _, target_tok, values_tree = st.children
        known = self.names.get(str(target_tok))
        if known is None or known.kind != "op":
            what = "an unknown name" if known is None else known.describe()
            raise self.error(target_tok, f"only a let-bound op can be replaced, and '{target_tok}' is {what}")
        values = tuple(self.value(v, "Rewrite") for v in _present(values_tree.children))
        return Replace(str(target_tok), values)

    def value(self, t: Token | Tree, kind: str) -> Expr:
        """An expression that cannot be `_`."""
        expr = self.expr(t, kind)
        assert expr is not None  # only build operands allow `_`
        return expr

    def expr(self, t: Token | Tree, kind: str, operand: bool = False) -> Expr | None:
        """An expression of the rewrite half (kind "Rewrite") or a constraint argument ("Constraint").

        `operand` allows `_`, an omitted optional input of a built op (None)."""
        if isinstance(t, Token) or t.data == "list":
            return Lit(self.f.literal(t))
        if t.data == "ref":
            return self.ref(t, kind, operand)
        if kind == "Constraint":
            raise self.error(t, "constraint arguments must be names or literals")
        if t.data == "call":
            return self.call(t, "Rewrite")
        if t.data == "choose":
            return self.choose(t)
        if t.data == "opset_choose":
            return self.opset_choose(t)
        if t.data == "first_of":
            return FirstOf(tuple(self.value(o, "Rewrite") for o in _present(t.children)[1:]))
        return self.build_op(t)

    def opset_choose(self, t: Tree) -> OpsetChoose:
        _, opset_tree, *branch_trees = _present(t.children)
        branches: list[tuple[OpsetGuard, Expr]] = []
        for b in branch_trees:
            cmp_tok, version_tok, value = b.children
            branches.append((self.opset_range(opset_tree, cmp_tok, version_tok), self.value(value, "Rewrite")))
        return OpsetChoose(branches[0][0].domain, tuple(branches))

    def choose(self, t: Tree) -> Choose:
        _, tag_tree, *branch_trees = _present(t.children)
        tag = self.ref(tag_tree, "Rewrite", operand=False)
        assert tag is not None
        known = self.names[tag.name]
        if tag.field is None and known.kind not in ("tag", "type"):
            raise self.error(
                tag_tree.children[0],
                f"'{tag.name}' is {known.describe()}; `alt` in a rewrite chooses by an alternative's tag, a matched op type or a native Rewrite's result field",
            )
        labels = self.tag_labels.get(tag.name) if tag.field is None else None
        branches: list[tuple[str, Expr | None]] = []
        for b in branch_trees:
            label_tok, value = b.children
            label = self.f.check_name(label_tok, "a branch label")
            if any(label == existing for existing, _ in branches):
                raise self.error(label_tok, f"branch '{label}' appears twice")
            if labels is not None and label not in labels:
                raise self.error(label_tok, f"alternatives '{tag.name}' have no branch '{label}' (branches: {', '.join(labels)})")
            branches.append((label, self.expr(value, "Rewrite", operand=True)))  # `_`: nothing (an omitted input)
        if labels is not None:
            missing = [label for label in labels if label not in dict(branches)]
            if missing:
                raise self.error(tag_tree.children[0], f"no value for branch{'es' if len(missing) > 1 else ''} {', '.join(missing)} of alternatives '{tag.name}'")
        return Choose(tag, tuple(branches))

    def ref(self, t: Tree, kind: str, operand: bool) -> Ref | None:
        name_tok, field_tok = t.children
        name = str(name_tok)
        if name == "_":
            if operand and field_tok is None:
                return None
            raise self.error(name_tok, "'_' (an omitted input) can only be an operand of op<...>(...) in a rewrite")
        known = self.names.get(name)
        if known is None:
            raise self.error(name_tok, f"unknown name '{name}'")
        if field_tok is not None and isinstance(known.node, Build) and known.kind == "let":
            index = int(str(field_tok)) if str(field_tok).isdigit() else None
            if index is None or index >= known.node.num_outputs:
                raise self.error(field_tok, f"'{name}' is an op with {known.node.num_outputs} output(s); select one by number, 0 to {known.node.num_outputs - 1}")
        elif field_tok is not None:
            if known.kind != "let" or not isinstance(known.node, Call):
                raise self.error(field_tok, f"'{name}' is {known.describe()} and has no fields; only a native Rewrite's result has")
            decl = self.f.decls.get(("Rewrite", known.node.name))
            if decl is not None and str(field_tok) not in decl.results:
                results = ", ".join(decl.results) if decl.results else "none"
                raise self.error(field_tok, f"{known.node.name} has no result '{field_tok}' (declared results: {results})")
        return Ref(name, None if field_tok is None else str(field_tok))

    def call(self, t: Tree, kind: str) -> Call:
        name_tok, *arg_trees = t.children
        name = self.f.check_name(name_tok, "a native name")
        args = tuple(self.value(a, kind) for a in _present(arg_trees))
        decl = self.f.decls.get((kind, name))
        if decl is None:
            other = "Rewrite" if kind == "Constraint" else "Constraint"
            if (other, name) in self.f.decls:
                where = self.f.decls[(other, name)].loc
                place = "a constraint" if kind == "Constraint" else "a rewrite"
                raise self.error(name_tok, f"'{name}' is declared as a {other} at {_at(where)}, but is called as {place}")
            decl = NativeDecl(kind, name, loc=self.f.loc(name_tok))
        elif len(decl.params) != len(args):
            raise self.error(name_tok, f"{name} takes {len(decl.params)} arguments (declared at {_at(decl.loc)}), got {len(args)}")
        else:
            for i, (arg_tree, arg) in enumerate(zip(_present(arg_trees), args)):
                wanted, actual = decl.param_kind(i), self.kind_of(arg)
                if "any" not in (wanted, actual) and wanted != actual:
                    raise self.error(
                        arg_tree, f"{name}'s parameter '{decl.params[i]}' is a {wanted} (declared at {_at(decl.loc)}), but this argument is a {actual}"
                    )
        self.used_natives.setdefault((kind, name), decl)
        return Call(name, args)

    def kind_of(self, expr: Expr) -> str:
        """What an expression is, in the kinds native declarations use (see ir.NATIVE_KINDS)."""
        if isinstance(expr, Lit):
            return "attr"
        if isinstance(expr, Build):
            return "value"
        if not isinstance(expr, Ref):
            return "any"
        known = self.names.get(expr.name)
        if known is None:
            return "any"
        if known.kind in ("value", "op", "alt"):
            return "value"
        if known.kind in ("attr", "tag", "type"):
            return known.kind
        if isinstance(known.node, Build):
            return "value"
        if isinstance(known.node, Call) and expr.field is not None:
            decl = self.f.decls.get(("Rewrite", known.node.name))
            return decl.result_kind(expr.field) if decl is not None else "any"
        return "any"

    def build_op(self, t: Tree) -> Build:
        children = t.children
        domain, op_type = self.op_name(children[1])
        type_ref = None
        known = self.names.get(op_type) if not domain else None
        if known is not None and known.kind == "type":
            type_ref, op_type = op_type, ""  # `op<kind>(...)`: the type an `op<kind: A|B>` matched
        outputs_tok = children[2]
        num_outputs = 1 if outputs_tok is None else self.f.small_int(outputs_tok, "number of outputs", 1)
        operands = tuple(self.expr(o, "Rewrite", operand=True) for o in _present(children[3:-1]))
        for tree, operand in zip(_present(children[3:-1]), operands):
            if isinstance(operand, Ref) and operand.field is not None and self.kind_of(operand) in ("attr", "tag", "type"):
                raise self.error(tree, f"an operand must be a value, and '{operand.field}' is declared as a{'n' if self.kind_of(operand) == 'attr' else ''} {self.kind_of(operand)}")
        attrs: list[tuple[str, Expr]] = []
        copy_from: str | None = None
        if children[-1] is not None:
            for a in _present(children[-1].children):
                if a.data == "copy_attr":
                    src = a.children[0]
                    if copy_from is not None:
                        raise self.error(src, "attributes can be copied from one matched op only")
                    known = self.names.get(str(src))
                    if known is None or known.kind != "op":
                        what = "an unknown name" if known is None else known.describe()
                        raise self.error(src, f"attributes can only be copied from a let-bound op, and '{src}' is {what}")
                    copy_from = str(src)
                else:
                    name_tok, value = a.children
                    if any(n == str(name_tok) for n, _ in attrs):
                        raise self.error(name_tok, f"attribute '{name_tok}' is set twice")
                    attr_value = self.value(value, "Rewrite")
                    if isinstance(attr_value, Ref) and attr_value.field is not None and self.kind_of(attr_value) == "value":
                        raise self.error(value, f"attribute '{name_tok}' is set from a value result ('{attr_value.field}' is declared as a value, not an attr)")
                    attrs.append((str(name_tok), attr_value))
        return Build(op_type, domain, operands, tuple(attrs), copy_from, num_outputs, type_ref)

