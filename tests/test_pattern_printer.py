"""The printer: .pdll text that parses back to an equal PatternFile / Rule."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphopt.pattern import parse_pdll, print_pattern_file, print_rule
from graphopt.pattern.ir import (
    MISSING,
    AltMatch,
    AttrMatch,
    Build,
    Call,
    Expr,
    Let,
    Lit,
    MatchNode,
    NativeDecl,
    OpMatch,
    PatternFile,
    Ref,
    Replace,
    Rule,
    Statement,
    ValueConstraint,
    Var,
    bound_names,
    iter_match_nodes,
)
from graphopt.pattern.python import RULES, Const, DType, Optional, alt, attr, native, op, replace, rule, wildcard


def strip(r: Rule) -> Rule:
    return dataclasses.replace(r, loc=None, natives=())


def strip_file(pf: PatternFile) -> PatternFile:
    return PatternFile("", tuple(dataclasses.replace(d, loc=None) for d in pf.natives), tuple(strip(r) for r in pf.rules))


def assert_round_trip(r: Rule) -> str:
    text = print_rule(r)
    (back,) = parse_pdll(text, "printed.pdll").rules
    # repr too: == cannot tell 1 from 1.0 from True
    assert strip(back) == strip(r), text
    assert repr(strip(back)) == repr(strip(r)), text
    assert print_rule(back) == text  # printing is stable
    return text


# ------------------------------------------------------------------ golden output

FOLD_BN = """\
Constraint IsLosslessWidening(src, mid);
Rewrite FoldBN(w, b, g, beta, mean, var, eps) -> (w, b);

/// Conv followed by inference BatchNormalization -> one Conv with folded weights
Pattern FoldConvBatchNorm with benefit(3) {
  let conv = op<Conv>(x, w: Const, b?: Const);
  let bn = op<BatchNormalization>(conv, g: Const, beta: Const, mean: Const, var: Const) {epsilon = eps, training_mode = 0};
  SameRank(w, g);
  rewrite bn with {
    let f = FoldBN(w, b, g, beta, mean, var, eps);
    replace bn with op<Conv>(x, f.w, f.b) {..conv};
  };
}

Pattern DropIdentityCast {
  let c = op<Cast>(x: DType<f32>) {to = 1};
  replace c with x;
}
"""


def test_golden_file_prints_back_identically() -> None:
    pf = parse_pdll(FOLD_BN, "fold.pdll")
    assert print_pattern_file(pf) == FOLD_BN


def test_printer_normalizes_layout_and_keeps_param_kinds() -> None:
    messy = """
        Constraint  C( a : Attr ,b);   // comment
        Pattern   P   {
          let r=op<Relu>( x :[ Const ] ) { alpha=1.0 } ;
          replace r with (x);
        }
    """
    assert print_pattern_file(parse_pdll(messy, "m.pdll")) == (
        "Constraint C(a: attr, b);\n\nPattern P {\n  let r = op<Relu>(x: Const) {alpha = 1.0};\n  replace r with x;\n}\n"
    )


# ------------------------------------------------------------------ hand-written files covering every feature

EVERYTHING = """
Constraint Check(a, b, c);
Rewrite Split2(x) -> (lo, hi);
Rewrite Plain(x);

/// line one
/// line two
Pattern Everything with benefit(0) {
  let s = op<Split>(x: [Const, Rank<4>], _: OneUse, _?)[1];
  let m = alt kind { mm: op<MatMul>(s, b?: DType<f16, "my type">), gemm: op<Gemm>(s, b, _?), raw: s };
  let r = op<com.microsoft.Add>(m, m, op<Relu>(s) {alpha = a default 0.5, beta = [1, [2.0], []] default [], g = "s" default "t", h = true});
  Check(s, kind, "lit");
  rewrite r with {
    let f = Split2(x);
    let p = Plain(f.hi);
    replace s with (f.lo, p);
    replace r with (op<graphopt.Fused, 2>(f.lo, _, 1e-05, -3, false) {..r, k = kind, c = Helper(f.hi), d = [1]}, a);
  };
}

Pattern Nested {
  let inner = op<Sigmoid>(v: Scalar);
  let r = op<Mul>(alt outer { one: alt innr { a: inner, b: op<Tanh>(inner) }, two: v }, inner) {x = 1 default 2};
  replace r with op<Out>();
}
"""


def test_round_trip_of_a_file_with_every_feature() -> None:
    pf = parse_pdll(EVERYTHING, "every.pdll")
    text = print_pattern_file(pf)
    back = parse_pdll(text, "again.pdll")
    assert strip_file(back) == strip_file(pf)
    assert repr(strip_file(back)) == repr(strip_file(pf))
    assert back.rules[0].doc == "line one\nline two"
    for r in pf.rules:
        assert_round_trip(r)


def test_shared_alternatives_get_a_let_and_stay_shared() -> None:
    r = parse_pdll(EVERYTHING, "every.pdll").rules[0]
    text = print_rule(r)
    assert "let kind_alt = alt kind {" in text and "op<com.microsoft.Add>(kind_alt, kind_alt," in text
    (back,) = parse_pdll(text, "p.pdll").rules
    assert back.root.operands[0] is back.root.operands[1]


def test_alternative_used_once_stays_inline() -> None:
    r = parse_pdll("Pattern P { let m = alt t { a: op<A>(x) }; let r = op<R>(m); replace r with x; }", "p.pdll").rules[0]
    assert "let r = op<R>(alt t {a: op<A>(x)});" in print_rule(r)


def test_constraints_print_once_per_value() -> None:
    r = parse_pdll("Pattern P { let r = op<Add>(x: Const, op<Neg>(x)); replace r with x; }", "p.pdll").rules[0]
    text = assert_round_trip(r)
    assert text.count("Const") == 1


# ------------------------------------------------------------------ Python-form rules


@rule(benefit=2)
def PyFold(x, w: Const, b: Optional[Const], g: Const):
    """Python form, printed"""
    conv = op.Conv(x, w, b)
    mul = op.Mul(conv, g)
    native.SameShape(w, g).require()
    f = native.Fold(w, b, g)
    return replace(mul, op.Conv(x, f.w, f.b).copy_attrs(conv))


@rule
def PyAlt(a, b, c: DType("f16")):
    mm = alt("form", mm=op.MatMul(a, b), gemm=op.Gemm(a, b, wildcard(optional=True)))
    add = op.Add(mm, c).attrs(k=attr("kk", default=[1, 2]))
    return replace(add, op["graphopt"].MatMulAdd(a, b, c, None).attrs(form=mm.tag, k=attr("kk")).outputs(2), a)


@pytest.mark.parametrize("r", [PyFold, PyAlt], ids=lambda r: r.name)
def test_round_trip_of_python_rules(r: Rule) -> None:
    assert_round_trip(r)


def test_round_trip_of_every_recorded_python_rule() -> None:
    assert len(RULES) >= 2
    for r in RULES:
        assert_round_trip(r)


# ------------------------------------------------------------------ what the language cannot say


@pytest.mark.parametrize(
    "r, fragment",
    [
        (Rule("P", OpMatch("A", operands=(Var("x"),)), (Replace("r", (Ref("x"),)),)), "root op must have a let name"),
        (Rule("P", OpMatch("A", attrs=(AttrMatch("a"),), name="r"), (Replace("r", (Ref("r"),)),)), "exactly one of a literal or a binding"),
        (Rule("P", OpMatch("A", name="r"), (Replace("r", (Lit(float("nan")),)),)), "cannot be written as a .pdll literal"),
        (Rule("P", OpMatch("A", name="r"), (Replace("r", (Lit(object()),)),)), "cannot be written as a .pdll literal"),
        (Rule("P", OpMatch("A", operands=(Var("bad name"),), name="r"), (Replace("r", (Ref("r"),)),)), "cannot be written as a name"),
        (Rule("let", OpMatch("A", name="r"), (Replace("r", (Ref("r"),)),)), "cannot be written as a name"),
        (Rule("P", OpMatch("A.B", name="r"), (Replace("r", (Ref("r"),)),)), "cannot be written as a name"),
    ],
)
def test_inexpressible_ir_raises_value_error(r: Rule, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.").replace("(", r"\(")):
        print_rule(r)


# ------------------------------------------------------------------ random rules over the IR

_CHARS = st.characters(blacklist_categories=("Cs", "Cc"))
_SCALARS = st.one_of(
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=6),
    st.booleans(),
)
_LITERALS = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3), max_leaves=5)
_CONSTRAINT = st.one_of(
    st.sampled_from([ValueConstraint("Const"), ValueConstraint("OneUse"), ValueConstraint("Scalar")]),
    st.integers(0, 8).map(lambda n: ValueConstraint("Rank", (n,))),
    st.lists(st.sampled_from(["f16", "bf16", "f32", "i64", "float 8", "op", "x-y"]), min_size=1, max_size=3, unique=True).map(
        lambda ts: ValueConstraint("DType", tuple(ts))
    ),
)
_CONSTRAINTS = st.lists(_CONSTRAINT, max_size=3, unique=True).map(tuple)
_OP_TYPES = st.sampled_from(["Add", "Conv", "MatMul", "Relu", "Split", "FusedAttention"])
_DOMAINS = st.sampled_from(["", "", "com.microsoft", "graphopt", "ai.onnx.ml"])
_ATTR_NAMES = st.lists(st.sampled_from(["axis", "alpha", "beta", "epsilon", "to", "perm"]), max_size=3, unique=True)


class _Gen:
    """Draws one valid Rule: disjoint name pools per kind, shared nodes drawn from finished ones."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.var_constraints: dict[str, tuple[ValueConstraint, ...]] = {}
        self.named_ops: list[OpMatch] = []
        self.alts: list[AltMatch] = []
        self.n_ops = 0
        self.n_tags = 0

    # -------------------------------------------------------------- match
    def operand(self, depth: int) -> MatchNode:
        kinds = ["var", "var", "wildcard"] + (["op", "op", "alt"] if depth < 3 else [])
        kinds += ["shared_op"] * bool(self.named_ops) + ["shared_alt"] * bool(self.alts)
        kind = self.draw(st.sampled_from(kinds))
        if kind == "var":
            name = self.draw(st.sampled_from(["v0", "v1", "v2", "v3"]))
            constraints = self.var_constraints.setdefault(name, self.draw(_CONSTRAINTS))
            return Var(name, constraints, self.draw(st.booleans()))
        if kind == "wildcard":
            return Var("_", self.draw(_CONSTRAINTS), self.draw(st.booleans()))
        if kind == "op":
            return self.op(depth + 1, named=self.draw(st.booleans()))
        if kind == "alt":
            return self.alt(depth + 1)
        if kind == "shared_op":
            return self.draw(st.sampled_from(self.named_ops))
        return self.draw(st.sampled_from(self.alts))

    def op(self, depth: int, named: bool) -> OpMatch:
        operands = tuple(self.operand(depth) for _ in range(self.draw(st.integers(0, 3))))
        attrs = tuple(self.attr_match(n) for n in self.draw(_ATTR_NAMES))
        name = None
        if named:
            name = f"n{self.n_ops}"
            self.n_ops += 1
        node = OpMatch(self.draw(_OP_TYPES), self.draw(_DOMAINS), operands, attrs, name, self.draw(st.integers(0, 2)))
        if named:
            self.named_ops.append(node)
        return node

    def attr_match(self, name: str) -> AttrMatch:
        bind = self.draw(st.sampled_from([None, "e0", "e1", "e2"]))
        default = self.draw(st.one_of(st.just(MISSING), _LITERALS))
        if bind is None:
            return AttrMatch(name, literal=self.draw(_LITERALS), default=default)
        return AttrMatch(name, bind=bind, default=default)

    def alt(self, depth: int) -> AltMatch:
        tag = f"t{self.n_tags}"
        self.n_tags += 1
        labels = self.draw(st.lists(st.sampled_from(["a", "b", "mm", "gemm"]), min_size=1, max_size=3, unique=True))
        node = AltMatch(tag, tuple((label, self.operand(depth)) for label in labels))
        self.alts.append(node)  # shareable only once finished: no cycles
        return node

    # -------------------------------------------------------------- rewrite
    def expr(self, names: list[str], lets: dict[str, bool], op_names: list[str], depth: int, operand: bool = False) -> Expr | None:
        kinds = ["ref", "lit"] + (["call", "build"] if depth < 2 else []) + ["let"] * bool(lets) + ["none"] * operand
        kind = self.draw(st.sampled_from(kinds))
        if kind == "ref":
            return Ref(self.draw(st.sampled_from(names)))
        if kind == "lit":
            return Lit(self.draw(_LITERALS))
        if kind == "none":
            return None
        if kind == "let":
            name = self.draw(st.sampled_from(sorted(lets)))
            field = self.draw(st.sampled_from([None, "w", "b"])) if lets[name] else None
            return Ref(name, field)
        args = tuple(self.expr(names, lets, op_names, depth + 1) for _ in range(self.draw(st.integers(0, 2))))
        if kind == "call":
            return Call(self.draw(st.sampled_from(["F0", "F1"])), args)  # type: ignore[arg-type]
        operands = tuple(self.expr(names, lets, op_names, depth + 1, operand=True) for _ in range(self.draw(st.integers(0, 3))))
        attrs = tuple((n, self.expr(names, lets, op_names, depth + 1)) for n in self.draw(_ATTR_NAMES))
        copy_from = self.draw(st.sampled_from([None, *op_names]))
        return Build(self.draw(_OP_TYPES), self.draw(_DOMAINS), operands, attrs, copy_from, self.draw(st.integers(1, 3)))  # type: ignore[arg-type]

    def rule(self) -> Rule:
        root = self.op(0, named=True)
        names = sorted(bound_names(root))
        op_names = sorted(n.name for n in iter_match_nodes(root) if isinstance(n, OpMatch) and n.name)
        constraints = tuple(
            Call(
                self.draw(st.sampled_from(["C0", "C1"])),
                tuple(
                    self.draw(st.one_of(st.sampled_from(names).map(Ref), _LITERALS.map(Lit))) for _ in range(self.draw(st.integers(0, 3)))
                ),
            )
            for _ in range(self.draw(st.integers(0, 2)))
        )
        body: list[Statement] = []
        lets: dict[str, bool] = {}  # let name -> bound to a native call (so it has fields)
        for i in range(self.draw(st.integers(0, 3))):
            if self.draw(st.booleans()):
                value = self.expr(names, lets, op_names, 0)
                assert value is not None
                body.append(Let(f"r{i}", value))
                lets[f"r{i}"] = isinstance(value, Call)
            else:
                body.append(self.replace(names, lets, op_names))
        body.append(self.replace(names, lets, op_names))
        doc_lines = self.draw(st.lists(st.text(_CHARS, max_size=12).map(str.strip), max_size=2))
        return Rule(
            name=self.draw(st.sampled_from(["P", "Fuse", "Rule_1"])),
            root=root,
            body=tuple(body),
            constraints=constraints,
            benefit=self.draw(st.one_of(st.none(), st.integers(0, 100))),
            doc="\n".join(doc_lines),
        )

    def replace(self, names: list[str], lets: dict[str, bool], op_names: list[str]) -> Replace:
        values = tuple(self.expr(names, lets, op_names, 0) for _ in range(self.draw(st.integers(1, 2))))
        return Replace(self.draw(st.sampled_from(op_names)), values)  # type: ignore[arg-type]


@st.composite
def random_rules(draw: st.DrawFn) -> Rule:
    return _Gen(draw).rule()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(random_rules())
def test_random_rules_round_trip(r: Rule) -> None:
    assert_round_trip(r)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(random_rules(), min_size=1, max_size=3))
def test_random_files_round_trip(rules: list[Rule]) -> None:
    rules = [dataclasses.replace(r, name=f"{r.name}{i}") for i, r in enumerate(rules)]  # names are unique per file
    natives = (NativeDecl("Constraint", "C9", ("a", "b")), NativeDecl("Rewrite", "F9", ("x",), ("w", "b")), NativeDecl("Rewrite", "G9"))
    pf = PatternFile("f.pdll", natives, tuple(rules))
    back = parse_pdll(print_pattern_file(pf), "f.pdll")
    assert repr(strip_file(back)) == repr(strip_file(pf))


def test_round_trip_of_the_shipped_pattern_library() -> None:
    from pathlib import Path

    from graphopt.pattern import parse_pdll_file

    files = sorted((Path(__file__).resolve().parents[1] / "rules").glob("*.pdll"))
    if not files:
        pytest.skip("no rules/*.pdll in this checkout")
    for path in files:
        pf = parse_pdll_file(path)
        back = parse_pdll(print_pattern_file(pf), str(path))
        assert repr(strip_file(back)) == repr(strip_file(pf)), path
