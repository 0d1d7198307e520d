"""The pattern IR: a small, frozen description of one rewrite rule.

Both front ends (the `.pdll` text parser and the embedded Python form) produce
these objects, the printer turns them back into text, and the matcher and the
rewrite executor consume them. Nothing here knows about ONNX or FX.

A rule has two halves:

* the *match* half, a DAG of `OpMatch` / `Var` / `AltMatch` nodes rooted at the
  op being replaced, plus native constraint calls over the bound names;
* the *rewrite* half, a list of statements (`Let`, `Replace`) over expressions
  (`Ref`, `Lit`, `Call`, `Build`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property

__all__ = [
    "MISSING",
    "SourceLoc",
    "ValueConstraint",
    "Var",
    "AttrMatch",
    "OpMatch",
    "AltMatch",
    "MatchNode",
    "OpsetGuard",
    "Choose",
    "OpsetChoose",
    "FirstOf",
    "Ref",
    "Lit",
    "Call",
    "Build",
    "Expr",
    "Let",
    "Replace",
    "Statement",
    "NativeDecl",
    "NATIVE_KINDS",
    "Rule",
    "PatternFile",
    "VALUE_CONSTRAINTS",
    "COMMUTATIVE_OPS",
    "COMMUTATIVE_FIRST_TWO",
    "iter_match_nodes",
    "bound_names",
    "default_benefit",
    "required_ops",
    "op_key_text",
    "parse_op_key",
    "EXPRESSION_HOLDERS",
    "field_names",
    "first_choice",
]


class _Missing:
    """Marker for "no value given" where None is a meaningful value."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __reduce__(self) -> str:
        return "MISSING"


MISSING = _Missing()

#: Value constraints understood by the matcher, with the number of arguments
#: each takes (None = any number, at least one).
VALUE_CONSTRAINTS: dict[str, int | None] = {
    "Const": 0,  # a constant: initializer (not an overridable input) or Constant node
    "Rank": 1,  # Rank<4>: statically known rank
    "DType": None,  # DType<f16, bf16>: element type is one of these
    "OneUse": 0,  # used exactly once and not a graph output
    "Scalar": 0,  # exactly one element (rank 0 or all dims 1)
}

#: Binary ops whose two operands the matcher tries in both orders.
COMMUTATIVE_OPS: frozenset[tuple[str, str]] = frozenset(
    {("", "Add"), ("", "Mul"), ("", "Max"), ("", "Min"), ("", "And"), ("", "Or"), ("", "Xor"), ("", "Equal"), ("", "Sum")}
)

#: Ops with more inputs whose first two commute: the matcher tries those two in both
#: orders (graphopt.SkipLayerNorm and SkipRMSNorm normalize input + skip), so a rule
#: that wants a form on either side is written once.
COMMUTATIVE_FIRST_TWO: frozenset[tuple[str, str]] = frozenset({("graphopt", "SkipLayerNorm"), ("graphopt", "SkipRMSNorm")})


@dataclass(frozen=True)
class SourceLoc:
    file: str
    line: int
    col: int = 1

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True)
class ValueConstraint:
    """A built-in constraint written on the value it restricts: `w: [Const, Rank<4>]`."""

    kind: str
    args: tuple[object, ...] = ()


# ---------------------------------------------------------------- match half


@dataclass(frozen=True)
class Var:
    """A leaf: binds any value (or checks a previous binding of the same name).

    `_` is a wildcard that binds nothing. An optional var (`b?`) also matches a
    missing trailing operand and then binds None.
    """

    name: str
    constraints: tuple[ValueConstraint, ...] = ()
    optional: bool = False


@dataclass(frozen=True)
class AttrMatch:
    """One attribute of an `OpMatch`.

    `{axis = 1}` compares with a literal; `{epsilon = eps}` binds the value to
    `eps`; `default` gives the value to use when the node lacks the attribute
    (otherwise the op schema's default is used).
    """

    name: str
    literal: object = MISSING
    bind: str | None = None
    default: object = MISSING


@dataclass(frozen=True)
class OpMatch:
    """Matches one node, by op type, operands and attributes.

    `name` is the `let` name (the rewrite can refer to the matched node through
    it); `output` picks which output of the node the operand refers to. Interior
    ops are single-use by default; a `shared` op may have users outside the match
    (it then survives the rewrite), e.g. a Shape feeding several Gathers.

    `op<Relu|Tanh|Sigmoid>` accepts any of several op types: `alternatives` holds
    the (domain, op_type) pairs after the first; `type_bind` (`op<kind: Relu|Tanh>`)
    binds the type that matched, as text ("Relu", "graphopt.FusedConv"), for the
    rewrite (an attribute value, or `op<kind>(...)` to build the same op).
    """

    op_type: str
    domain: str = ""
    operands: tuple[MatchNode, ...] = ()
    attrs: tuple[AttrMatch, ...] = ()
    name: str | None = None
    output: int = 0
    shared: bool = False
    alternatives: tuple[tuple[str, str], ...] = ()
    type_bind: str | None = None

    @property
    def keys(self) -> tuple[tuple[str, str], ...]:
        """Every (domain, op_type) this op matches, the first one first."""
        return ((self.domain, self.op_type), *self.alternatives)


@dataclass(frozen=True)
class AltMatch:
    """Tagged alternatives: `alt form { mm: op<MatMul>(a, b), gemm: op<Gemm>(a, b) }`.

    The first branch that matches wins; `tag_var` is bound to its tag so the
    rewrite (and native helpers) can see which one it was.
    """

    tag_var: str
    branches: tuple[tuple[str, MatchNode], ...]


MatchNode = Var | OpMatch | AltMatch


@dataclass(frozen=True)
class OpsetGuard:
    """`where opset >= 20;`: the rule applies only where the model imports `domain`
    at a version in [low, high] (None: unbounded). Checked once per graph, before matching."""

    domain: str = ""
    low: int | None = None
    high: int | None = None

    def admits(self, version: int | None) -> bool:
        if version is None:  # the model does not import the domain: older than any version
            return self.low is None
        return (self.low is None or version >= self.low) and (self.high is None or version <= self.high)

    def describe(self) -> str:
        what = f"opset({self.domain})" if self.domain else "opset"
        if self.low is not None and self.high is not None:
            return f"{what} >= {self.low}, <= {self.high}" if self.low != self.high else f"{what} == {self.low}"
        return f"{what} >= {self.low}" if self.low is not None else f"{what} <= {self.high}"

# -------------------------------------------------------------- rewrite half


@dataclass(frozen=True)
class Ref:
    """A bound name, optionally a field of a native rewrite's result (`f.w`)."""

    name: str
    field: str | None = None


@dataclass(frozen=True)
class Lit:
    """A literal: int, float, str, bool, or a list of those."""

    value: object


@dataclass(frozen=True)
class Call:
    """A call of a native Constraint or Rewrite, declared body-less and registered in Python."""

    name: str
    args: tuple[Expr, ...] = ()


@dataclass(frozen=True)
class Build:
    """A new node: `op<Conv>(x, f.w, f.b) {..conv, group = 1}`.

    `copy_from` copies every attribute of a matched node; `attrs` are set on
    top of that. An operand of None is an omitted optional input. `type_ref`
    names a matched op type (`op<kind: Relu|Tanh>` in the match, `op<kind>(y)`
    here): the new node gets that type, and `op_type` / `domain` are empty.
    """

    op_type: str
    domain: str = ""
    operands: tuple[Expr | None, ...] = ()
    attrs: tuple[tuple[str, Expr], ...] = ()
    copy_from: str | None = None
    num_outputs: int = 1
    type_ref: str | None = None


@dataclass(frozen=True)
class Choose:
    """`alt tag { a: expr, b: expr }`: the expression of the branch whose label is the tag's value.

    The tag is an alternative's tag (which branch matched) or a native Rewrite's
    result field; a value with no branch declines the rewrite.
    """

    tag: Ref
    branches: tuple[tuple[str, Expr | None], ...]  # None: `_`, an omitted input


@dataclass(frozen=True)
class OpsetChoose:
    """`alt opset { >= 20: expr, < 20: expr }`: the first branch whose range admits
    the model's version of `domain`; none admitting it declines the rewrite."""

    domain: str
    branches: tuple[tuple[OpsetGuard, Expr], ...]


@dataclass(frozen=True)
class FirstOf:
    """`first { a, b }`: `a` if the target can run what it builds, else `b`, and so on.

    The driver tries the rule once per option (see `graphopt.match.rewrite.target_variants`):
    one rule where two used to differ only in the op the target runs."""

    options: tuple[Expr, ...]


Expr = Ref | Lit | Call | Build | Choose | OpsetChoose | FirstOf


@dataclass(frozen=True)
class Let:
    name: str
    expr: Expr


@dataclass(frozen=True)
class Replace:
    """`replace root with expr` (or a tuple, one per output of the root)."""

    target: str
    values: tuple[Expr, ...]


Statement = Let | Replace


#: What a native helper's parameter or result is (`Rewrite F(q: value, eps: attr) -> (w: value)`):
#: a graph value (a tensor: bound value, matched op, built op, array result), an attribute
#: value or literal, an alternative's tag, a matched op type; "any" when not declared.
NATIVE_KINDS: frozenset[str] = frozenset({"value", "attr", "tag", "type", "any"})


@dataclass(frozen=True)
class NativeDecl:
    """A body-less `Constraint Name(a: value, b: attr);` or `Rewrite Name(a) -> (x: value, y: attr);`.

    `param_kinds` / `result_kinds` are one of NATIVE_KINDS each (empty: all "any")."""

    kind: str  # "Constraint" or "Rewrite"
    name: str
    params: tuple[str, ...] = ()
    results: tuple[str, ...] = ()
    loc: SourceLoc | None = None
    param_kinds: tuple[str, ...] = ()
    result_kinds: tuple[str, ...] = ()

    def param_kind(self, i: int) -> str:
        return self.param_kinds[i] if i < len(self.param_kinds) else "any"

    def result_kind(self, name: str) -> str:
        return self.result_kinds[self.results.index(name)] if name in self.results and self.result_kinds else "any"


@dataclass(frozen=True)
class Rule:
    name: str
    root: OpMatch
    body: tuple[Statement, ...]
    constraints: tuple[Call, ...] = ()
    benefit: int | None = None
    doc: str = ""
    loc: SourceLoc | None = None
    guards: tuple[OpsetGuard, ...] = ()
    # Not part of the rule's meaning; excluded from equality so round trips compare rules.
    natives: tuple[NativeDecl, ...] = field(default=(), compare=False)

    @cached_property  # the driver asks for every rule and variant, each sweep (the rule is frozen)
    def effective_benefit(self) -> int:
        return self.benefit if self.benefit is not None else default_benefit(self.root)

    @cached_property  # also kept in the pattern cache's pickles (graphopt.pattern.pdll)
    def first_choice(self) -> FirstOf | None:
        """The rewrite's first `first { ... }` (statements in order, depth first), or None:
        the driver tries the rule once per option of it (graphopt.match.rewrite.target_variants)."""
        return first_choice(self.body)

    @property
    def root_keys(self) -> tuple[tuple[str, str], ...]:
        """Every (domain, op_type) the root matches: the driver tries the rule at nodes of each."""
        return self.root.keys


@dataclass(frozen=True)
class PatternFile:
    path: str
    natives: tuple[NativeDecl, ...]
    rules: tuple[Rule, ...]


# ------------------------------------------------------------------ helpers


def iter_match_nodes(node: MatchNode, _seen: set[int] | None = None):
    """Every match node reachable from `node`, each once (patterns are DAGs)."""
    seen = _seen if _seen is not None else set()
    if id(node) in seen:
        return
    seen.add(id(node))
    yield node
    if isinstance(node, OpMatch):
        for operand in node.operands:
            yield from iter_match_nodes(operand, seen)
    elif isinstance(node, AltMatch):
        for _, branch in node.branches:
            yield from iter_match_nodes(branch, seen)


def bound_names(node: MatchNode) -> set[str]:
    """Names a match binds: vars, let names, op type and attribute bindings, alt tags."""
    names: set[str] = set()
    for n in iter_match_nodes(node):
        if isinstance(n, Var) and n.name != "_":
            names.add(n.name)
        elif isinstance(n, OpMatch):
            if n.name:
                names.add(n.name)
            if n.type_bind:
                names.add(n.type_bind)
            names.update(a.bind for a in n.attrs if a.bind)
        elif isinstance(n, AltMatch):
            names.add(n.tag_var)
    return names


def default_benefit(node: MatchNode) -> int:
    """PDLL's default: the number of matched ops (alternatives count their largest branch)."""
    seen: set[int] = set()

    def count(n: MatchNode) -> int:
        if id(n) in seen:
            return 0
        seen.add(id(n))
        if isinstance(n, OpMatch):
            return 1 + sum(count(o) for o in n.operands)
        if isinstance(n, AltMatch):
            return max((count(b) for _, b in n.branches), default=0)
        return 0

    return count(node)


def required_ops(node: MatchNode) -> tuple[frozenset[tuple[str, str]], ...]:
    """The op types a match needs in the graph: one set per op position that every
    way of matching goes through, each set listing the types that can fill it (an
    alternative of ops needs one of its branches' root types; deeper in a branch, nothing). A graph lacking every type of one set
    cannot match: the driver skips the rule there (early reject)."""
    needed: dict[frozenset[tuple[str, str]], None] = {}
    seen: set[int] = set()

    def walk(n: MatchNode) -> None:
        if id(n) in seen or isinstance(n, Var):
            return
        if isinstance(n, AltMatch):  # one of its branches: their ops, if every branch is an op
            if all(isinstance(b, OpMatch) for _, b in n.branches):
                needed.setdefault(frozenset(k for _, b in n.branches for k in b.keys), None)  # type: ignore[union-attr]
            return
        seen.add(id(n))
        needed.setdefault(frozenset(n.keys), None)
        for operand in n.operands:
            walk(operand)

    walk(node)
    return tuple(needed)


#: The IR's classes whose fields can hold an expression (so a `first`).
EXPRESSION_HOLDERS = (Build, Call, Choose, OpsetChoose, FirstOf, Let, Replace)
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(kind: type) -> tuple[str, ...]:
    """A dataclass's field names, looked up once per class (`dataclasses.fields` on every
    node of every rule was most of the rule set's set-up)."""
    names = _FIELD_NAMES.get(kind)
    if names is None:
        names = _FIELD_NAMES[kind] = tuple(f.name for f in fields(kind))
    return names


def first_choice(body: tuple[Statement, ...]) -> FirstOf | None:
    """The first `first { ... }` in a rewrite's statements, depth first, or None."""

    def find(e: object) -> FirstOf | None:
        if isinstance(e, FirstOf):
            return e
        if isinstance(e, EXPRESSION_HOLDERS):
            for name in field_names(type(e)):
                value = getattr(e, name)
                for item in value if isinstance(value, tuple) else (value,):
                    for part in item if isinstance(item, tuple) else (item,):
                        found = find(part)
                        if found is not None:
                            return found
        return None

    for stmt in body:
        found = find(stmt)
        if found is not None:
            return found
    return None


def op_key_text(key: tuple[str, str]) -> str:
    """("", "Relu") -> "Relu"; ("graphopt", "FusedConv") -> "graphopt.FusedConv"."""
    return f"{key[0]}.{key[1]}" if key[0] else key[1]


def parse_op_key(text: str) -> tuple[str, str]:
    """The inverse of `op_key_text`."""
    domain, _, op_type = text.rpartition(".")
    return domain, op_type
