"""The .pdll front end: every syntax feature to its exact IR, error positions, fuzzing, and the loader."""

from __future__ import annotations

import dataclasses
import re
import textwrap
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphopt.errors import PatternError
from graphopt.pattern import load_patterns, parse_pdll
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
    Ref,
    Replace,
    Rule,
    SourceLoc,
    ValueConstraint,
    Var,
)

CONST = ValueConstraint("Const")


def rule_of(text: str, path: str = "t.pdll") -> Rule:
    rules = parse_pdll(textwrap.dedent(text), path).rules
    assert len(rules) == 1
    return rules[0]


def root_of(match_lines: str, root: str = "r") -> OpMatch:
    """The root OpMatch of a pattern made of `match_lines` and `replace root with root`."""
    return rule_of(f"Pattern P {{\n{match_lines}\nreplace {root} with {root};\n}}").root


def error_of(text: str, path: str = "t.pdll") -> str:
    with pytest.raises(PatternError) as info:
        parse_pdll(textwrap.dedent(text), path)
    return str(info.value)


# ------------------------------------------------------------------ the design example

FOLD_BN = """\
// line comment at the top
Constraint IsLosslessWidening(src: Attr, mid: Attr);          // typed params (PDLL's spelling)
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
  replace c with x;   // shorthand: no rewrite block
}
"""


def test_design_example_parses_to_exact_ir() -> None:
    pf = parse_pdll(FOLD_BN, "fold.pdll")
    assert pf.path == "fold.pdll"
    assert pf.natives == (
        NativeDecl("Constraint", "IsLosslessWidening", ("src", "mid"), (), SourceLoc("fold.pdll", 2, 1), ("attr", "attr")),
        NativeDecl("Rewrite", "FoldBN", ("w", "b", "g", "beta", "mean", "var", "eps"), ("w", "b"), SourceLoc("fold.pdll", 3, 1)),
    )
    fold, drop = pf.rules
    conv = OpMatch("Conv", "", (Var("x"), Var("w", (CONST,)), Var("b", (CONST,), optional=True)), name="conv")
    bn = OpMatch(
        "BatchNormalization",
        "",
        (conv, Var("g", (CONST,)), Var("beta", (CONST,)), Var("mean", (CONST,)), Var("var", (CONST,))),
        (AttrMatch("epsilon", bind="eps"), AttrMatch("training_mode", literal=0)),
        name="bn",
    )
    assert fold == Rule(
        name="FoldConvBatchNorm",
        root=bn,
        body=(
            Let("f", Call("FoldBN", tuple(Ref(n) for n in ("w", "b", "g", "beta", "mean", "var", "eps")))),
            Replace("bn", (Build("Conv", "", (Ref("x"), Ref("f", "w"), Ref("f", "b")), copy_from="conv"),)),
        ),
        constraints=(Call("SameRank", (Ref("w"), Ref("g"))),),
        benefit=3,
        doc="Conv followed by inference BatchNormalization -> one Conv with folded weights",
        loc=SourceLoc("fold.pdll", 6, 1),
    )
    assert fold.root.operands[0] is fold.root.operands[0]  # conv is one object
    assert drop == Rule(
        name="DropIdentityCast",
        root=OpMatch("Cast", "", (Var("x", (ValueConstraint("DType", ("f32",)),)),), (AttrMatch("to", literal=1),), name="c"),
        body=(Replace("c", (Ref("x"),)),),
        loc=SourceLoc("fold.pdll", 16, 1),
    )
    assert drop.benefit is None and drop.doc == ""


def test_rule_natives_are_the_declarations_it_calls() -> None:
    fold = parse_pdll(FOLD_BN, "fold.pdll").rules[0]
    # SameRank is not declared: its synthesized declaration sits at the call.
    assert fold.natives == (
        NativeDecl("Constraint", "SameRank", (), (), SourceLoc("fold.pdll", 9, 3)),
        NativeDecl("Rewrite", "FoldBN", ("w", "b", "g", "beta", "mean", "var", "eps"), ("w", "b"), SourceLoc("fold.pdll", 3, 1)),
    )


# ------------------------------------------------------------------ declarations


def test_native_declaration_forms() -> None:
    pf = parse_pdll(
        "Constraint A();\nConstraint B(x);\nRewrite C(a: Value) -> w;\nRewrite D(a, b);\nRewrite E() -> ();\n",
        "d.pdll",
    )
    assert [(d.kind, d.name, d.params, d.results, d.loc.line) for d in pf.natives] == [  # type: ignore[union-attr]
        ("Constraint", "A", (), (), 1),
        ("Constraint", "B", ("x",), (), 2),
        ("Rewrite", "C", ("a",), ("w",), 3),
        ("Rewrite", "D", ("a", "b"), (), 4),
        ("Rewrite", "E", (), (), 5),
    ]
    assert pf.rules == ()


def test_empty_file_and_comments_only() -> None:
    assert parse_pdll("", "e.pdll").rules == ()
    assert parse_pdll("// nothing here\n/// not a doc of anything\n", "e.pdll").natives == ()


# ------------------------------------------------------------------ match operands


def test_plain_and_wildcard_operands() -> None:
    r = root_of("let r = op<Add>(x, _, _?, y?);")
    assert r.operands == (Var("x"), Var("_"), Var("_", optional=True), Var("y", optional=True))


def test_value_constraints_single_list_and_args() -> None:
    r = root_of('let r = op<F>(a: [Const, Rank<4>], b: DType<f16, bf16>, c: DType<"my type">, d: OneUse, e: Scalar, f?: Const);')
    assert r.operands == (
        Var("a", (CONST, ValueConstraint("Rank", (4,)))),
        Var("b", (ValueConstraint("DType", ("f16", "bf16")),)),
        Var("c", (ValueConstraint("DType", ("my type",)),)),
        Var("d", (ValueConstraint("OneUse"),)),
        Var("e", (ValueConstraint("Scalar"),)),
        Var("f", (CONST,), optional=True),
    )


def test_constraints_restrict_the_value_everywhere_it_occurs() -> None:
    # Written once, on either occurrence; both occurrences carry the union.
    r = root_of("let m = op<Mul>(x, y);\nlet r = op<Add>(m, x: Const, y: Rank<2>);\n")
    m = r.operands[0]
    assert isinstance(m, OpMatch)
    assert m.operands == (Var("x", (CONST,)), Var("y", (ValueConstraint("Rank", (2,)),)))
    assert r.operands[1:] == (Var("x", (CONST,)), Var("y", (ValueConstraint("Rank", (2,)),)))
    # ...but '?' belongs to the occurrence.
    r = root_of("let r = op<Add>(x?, x);")
    assert r.operands == (Var("x", optional=True), Var("x"))


def test_repeated_constraints_are_merged_without_duplicates() -> None:
    r = root_of("let r = op<Add>(x: [Const, Scalar], x: [Scalar, Rank<0>]);")
    expected = (CONST, ValueConstraint("Scalar"), ValueConstraint("Rank", (0,)))
    assert r.operands == (Var("x", expected), Var("x", expected))


def test_nested_inline_op_and_let_reuse_make_a_dag() -> None:
    r = root_of("let s = op<Sigmoid>(x);\nlet r = op<Mul>(s, op<Relu>(s));")
    s = OpMatch("Sigmoid", "", (Var("x"),), name="s")
    assert r == OpMatch("Mul", "", (s, OpMatch("Relu", "", (s,))), name="r")
    relu = r.operands[1]
    assert isinstance(relu, OpMatch)
    assert r.operands[0] is relu.operands[0]  # the same OpMatch object, not a copy


def test_domain_and_output_selection() -> None:
    r = root_of("let r = op<com.microsoft.FusedConv>(op<Split>(x)[1], op<ai.onnx.ml.Foo>(y) {a = 1}[2]);")
    assert (r.domain, r.op_type) == ("com.microsoft", "FusedConv")
    assert r.operands == (
        OpMatch("Split", "", (Var("x"),), output=1),
        OpMatch("Foo", "ai.onnx.ml", (Var("y"),), (AttrMatch("a", literal=1),), output=2),
    )
    assert root_of("let r = op<Split>(x)[0];").output == 0


def test_let_bound_op_with_output_selection() -> None:
    r = root_of("let s = op<Split>(x)[1];\nlet r = op<Relu>(s);")
    assert r.operands == (OpMatch("Split", "", (Var("x"),), name="s", output=1),)


def test_no_operands_and_empty_attrs() -> None:
    r = root_of("let r = op<RandomNormal>() {};")
    assert r == OpMatch("RandomNormal", "", (), (), name="r")


# ------------------------------------------------------------------ attributes and literals


def test_attribute_match_forms() -> None:
    r = root_of('let r = op<F>(x) {a = 1, b = eps, c = eps2 default 1e-5, d = "NOTSET" default "NOTSET", e = eps};')
    assert r.attrs == (
        AttrMatch("a", literal=1),
        AttrMatch("b", bind="eps"),
        AttrMatch("c", bind="eps2", default=1e-5),
        AttrMatch("d", literal="NOTSET", default="NOTSET"),
        AttrMatch("e", bind="eps"),  # the same binding twice: both attributes must be equal
    )
    assert r.attrs[0].default is MISSING and r.attrs[1].literal is MISSING


@pytest.mark.parametrize(
    "text, value",
    [
        ("0", 0),
        ("-3", -3),
        ("12345678901234567890", 12345678901234567890),
        ("1.0", 1.0),
        ("-2.5", -2.5),
        ("1e-5", 1e-5),
        ("1E+20", 1e20),
        (".5", 0.5),
        ("3.", 3.0),
        ('"NOTSET"', "NOTSET"),
        ('"a\\"b\\\\c\\n\\u00e9"', 'a"b\\c\né'),
        ('"ünï cödé"', "ünï cödé"),
        ("true", True),
        ("false", False),
        ("[]", []),
        ("[1, 1]", [1, 1]),
        ('[[1, 2.0], [], ["s", true]]', [[1, 2.0], [], ["s", True]]),
    ],
)
def test_literals(text: str, value: object) -> None:
    (a,) = root_of(f"let r = op<F>(x) {{a = {text}}};").attrs
    assert a.literal == value
    assert repr(a.literal) == repr(value)  # the type too: 1 is not 1.0 is not True


# ------------------------------------------------------------------ alternatives


def test_inline_alternatives() -> None:
    r = root_of("let r = op<Add>(alt kind { mm: op<MatMul>(a, b), gemm: op<Gemm>(a, b, _?), plain: a }, c);")
    assert r.operands == (
        AltMatch(
            "kind",
            (
                ("mm", OpMatch("MatMul", "", (Var("a"), Var("b")))),
                ("gemm", OpMatch("Gemm", "", (Var("a"), Var("b"), Var("_", optional=True)))),
                ("plain", Var("a")),
            ),
        ),
        Var("c"),
    )


def test_let_bound_alternatives_are_reused_and_may_be_the_only_use() -> None:
    r = root_of("let m = alt k { x: op<Relu>(v), y: op<Tanh>(v), };\nlet r = op<Add>(m, m);")
    assert isinstance(r.operands[0], AltMatch)
    assert r.operands[0] is r.operands[1]
    assert r.operands[0].tag_var == "k" and [t for t, _ in r.operands[0].branches] == ["x", "y"]


def test_nested_alternatives_and_let_ops_in_branches() -> None:
    r = root_of("let s = op<Sqrt>(v);\nlet r = op<Div>(x, alt a { s: s, n: alt b { one: op<Abs>(v) } });")
    alt_a = r.operands[1]
    assert isinstance(alt_a, AltMatch)
    assert alt_a.branches[0] == ("s", OpMatch("Sqrt", "", (Var("v"),), name="s"))
    assert alt_a.branches[1] == ("n", AltMatch("b", (("one", OpMatch("Abs", "", (Var("v"),))),)))


# ------------------------------------------------------------------ constraints calls and the rewrite half


def test_constraint_calls_with_names_and_literals() -> None:
    rule = rule_of("""
        Pattern P {
          let r = op<Relu>(x) {alpha = al};
          Check(x, r, al, 1, 2.5, "s", [1], false);
          Other();
          replace r with x;
        }
    """)
    assert rule.constraints == (
        Call("Check", (Ref("x"), Ref("r"), Ref("al"), Lit(1), Lit(2.5), Lit("s"), Lit([1]), Lit(False))),
        Call("Other", ()),
    )


def test_rewrite_block_statements_and_expressions() -> None:
    rule = rule_of("""
        Rewrite Split2(x) -> (lo, hi);
        Pattern P {
          let r = op<Foo>(x, y?) {k = kv};
          rewrite r with {
            let s = Split2(x);
            let c = op<graphopt.Fused, 2>(s.lo, _, y, 3) {..r, alpha = 1.5, beta = kv, gamma = Helper(s.hi, "z")};
            let plain = s;
            replace r with (c, [1, 2], false);
          };
        }
    """)
    assert rule.root == OpMatch("Foo", "", (Var("x"), Var("y", optional=True)), (AttrMatch("k", bind="kv"),), name="r")
    assert rule.body == (
        Let("s", Call("Split2", (Ref("x"),))),
        Let(
            "c",
            Build(
                "Fused",
                "graphopt",
                (Ref("s", "lo"), None, Ref("y"), Lit(3)),
                (("alpha", Lit(1.5)), ("beta", Ref("kv")), ("gamma", Call("Helper", (Ref("s", "hi"), Lit("z"))))),
                copy_from="r",
                num_outputs=2,
            ),
        ),
        Let("plain", Ref("s")),
        Replace("r", (Ref("c"), Lit([1, 2]), Lit(False))),
    )
    assert [(d.kind, d.name) for d in rule.natives] == [("Rewrite", "Split2"), ("Rewrite", "Helper")]


def test_rewrite_replaces_a_non_root_op_and_single_parenthesized_value() -> None:
    rule = rule_of("""
        Pattern P {
          let a = op<A>(x);
          let r = op<B>(a)
          ;
          rewrite r with { replace a with (x,); replace r with op<C>(); }
        }
    """)
    assert rule.body == (Replace("a", (Ref("x"),)), Replace("r", (Build("C"),)))


def test_doc_comment_must_be_directly_above_and_can_span_lines() -> None:
    pf = parse_pdll(
        "/// first\n///   second  \nPattern A { let r = op<R>(x); replace r with x; }\n"
        "/// detached\n\nPattern B { let r = op<R>(x); replace r with x; }\n"
        "// plain comment\nPattern C { let r = op<R>(x); replace r with x; }\n",
        "d.pdll",
    )
    assert [r.doc for r in pf.rules] == ["first\nsecond", "", ""]
    assert [r.loc.line for r in pf.rules] == [3, 6, 8]  # type: ignore[union-attr]


def test_rule_location_is_the_pattern_keyword() -> None:
    pf = parse_pdll("\n\n   Pattern X { let r = op<R>(x); replace r with x; }", "here.pdll")
    assert pf.rules[0].loc == SourceLoc("here.pdll", 3, 4)


def test_keyword_like_names_are_fine_when_only_a_prefix() -> None:
    r = root_of("let r = op<Add>(letter, option, alternative, default_value);")
    assert [v.name for v in r.operands] == ["letter", "option", "alternative", "default_value"]  # type: ignore[union-attr]


def test_unicode_names() -> None:
    r = root_of("let r = op<Add>(größe, x_1);")
    assert r.operands == (Var("größe"), Var("x_1"))


# ------------------------------------------------------------------ errors


def _position(message: str) -> tuple[str, int, int]:
    first = message.split("\n")[0]
    m = re.match(r"^(.*):(\d+):(\d+): ", first)
    assert m, f"message does not start with file:line:col: {message!r}"
    return m.group(1), int(m.group(2)), int(m.group(3))


ERRORS = [
    # (text, line, col, fragment)
    ("Pattern P { let r = op<A>(x) replace r with x; }", 1, 30, "syntax error: unexpected 'replace'"),
    ("Pattern P {\n  let r = op<A>(x);\n", 2, 20, "syntax error: unexpected end of file"),
    ("Pattern P {\n  let r = op<A>(x) {a = $};\n  replace r with x;\n}", 2, 25, "unexpected character '$'"),
    ("Pattern P {\n  let r = op<A>(x: Foo);\n  replace r with x;\n}", 2, 20, "unknown value constraint 'Foo'"),
    ("Pattern P {\n  let r = op<A>(x: Rank<1, 2>);\n  replace r with x;\n}", 2, 20, "Rank takes 1 argument, got 2"),
    ("Pattern P {\n  let r = op<A>(x: Rank<f32>);\n  replace r with x;\n}", 2, 20, "Rank takes a non-negative integer"),
    ("Pattern P {\n  let r = op<A>(x: DType<4>);\n  replace r with x;\n}", 2, 20, "DType takes element type names"),
    ("Pattern P {\n  let r = op<A>(x: Const<1>);\n  replace r with x;\n}", 2, 20, "Const takes 0 arguments"),
    ("Pattern P {\n  let r = op<A>(x: DType<>);\n  replace r with x;\n}", 2, 20, "DType needs at least one argument"),
    ("Pattern P {\n  let r = op<A>(x);\n}", 1, 9, "pattern 'P' has no rewrite"),
    ("Pattern P {\n  let r = op<A>(x);\n  replace q with x;\n}", 3, 11, "unknown name 'q'"),
    ("Pattern P {\n  let r = op<A>(x);\n  replace x with x;\n}", 3, 11, "the root 'x' must be a let-bound op"),
    ("Pattern P {\n  let r = op<A>(x);\n  replace r with zz;\n}", 3, 18, "unknown name 'zz'"),
    (
        "Pattern P {\n  let r = op<A>(c);\n  let c = op<C>(x);\n  replace r with x;\n}",
        3,
        7,
        "'c' is used at 2:17 before this let defines it",
    ),
    ("Pattern P {\n  let a = op<A>(x);\n  let r = op<B>(x);\n  replace r with x;\n}", 2, 7, "'a' is not connected to the root 'r'"),
    (
        "Pattern P {\n  let a = alt t { u: op<A>(x) };\n  let r = op<B>(x);\n  replace r with x;\n}",
        2,
        7,
        "'a' is not connected to the root 'r'",
    ),
    ("Pattern P {\n  let r = op<A>(x);\n  rewrite r with {\n    let y = x;\n  };\n}", 3, 3, "the rewrite block has no `replace"),
    ("Pattern P {\n  let r = op<A>(x);\n  replace r with x;\n  Check(x);\n}", 4, 3, "the rewrite must be the last statement"),
    ("Pattern P {\n  let r = op<A>(x);\n  replace r with x;\n  replace r with x;\n}", 4, 3, "the rewrite must be the last statement"),
    ("Pattern P {\n  let r = op<A>(x);\n  let r = op<B>(x);\n  replace r with x;\n}", 3, 7, "'r' is already defined as a let-bound op"),
    ("Pattern P {\n  let r = op<A>(x) {a = x};\n  replace r with x;\n}", 2, 25, "'x' is a value"),
    (
        "Pattern P {\n  let r = op<A>(e) {a = e2, b = 1};\n  let s = op<B>(r, e2);\n  replace s with r;\n}",
        3,
        20,
        "'e2' is an attribute binding",
    ),
    ("Pattern P {\n  let r = op<A>(x) {a = 1, a = 2};\n  replace r with x;\n}", 2, 28, "attribute 'a' is matched twice"),
    ("Pattern P {\n  let a = op<A>(x);\n  let r = op<B>(a?);\n  replace r with x;\n}", 3, 17, "'a' is a let-bound op"),
    ("Pattern P {\n  let r = op<A>(alt t { u: x, u: y });\n  replace r with x;\n}", 2, 31, "branch 'u' appears twice"),
    (
        "Pattern P {\n  let r = op<A>(alt t { u: x }, alt t { v: y });\n  replace r with x;\n}",
        2,
        37,
        "'t' is already defined as an alternative tag",
    ),
    ("Pattern P {\n  let r = op<A>(x);\n  replace r with x.w;\n}", 3, 20, "'x' is a value"),
    (
        "Rewrite F(a) -> (lo);\nPattern P {\n  let r = op<A>(x);\n  rewrite r with {\n    let f = F(x);\n    replace r with f.hi;\n  };\n}",
        6,
        22,
        "F has no result 'hi'",
    ),
    (
        "Rewrite F(a, b);\nPattern P {\n  let r = op<A>(x);\n  replace r with F(x);\n}",
        4,
        18,
        "F takes 2 arguments (declared at 1:1), got 1",
    ),
    (
        "Rewrite F(a);\nPattern P {\n  let r = op<A>(x);\n  F(x);\n  replace r with x;\n}",
        4,
        3,
        "'F' is declared as a Rewrite at 1:1, but is called as a constraint",
    ),
    ("Constraint C(a);\nPattern P {\n  let r = op<A>(x);\n  replace r with C(x);\n}", 4, 18, "'C' is declared as a Constraint"),
    ("Constraint C(a);\nConstraint C(b);\n", 2, 12, "Constraint 'C' is already declared at 1:1"),
    (
        "Pattern P {\n  let r = op<A>(x);\n  Check(op<B>(x));\n  replace r with x;\n}",
        3,
        9,
        "constraint arguments must be names or literals",
    ),
    ("Pattern P {\n  let r = op<A>(x);\n  Check(y);\n  replace r with x;\n}", 3, 9, "unknown name 'y'"),
    ("Pattern P {\n  let r = op<A>(x);\n  replace r with _;\n}", 3, 18, "'_' (an omitted input)"),
    ("Pattern P {\n  let r = op<A>(x);\n  replace r with op<B>(x) {..x};\n}", 3, 30, "attributes can only be copied from a let-bound op"),
    ("Pattern P {\n  let r = op<A>(x);\n  replace r with op<B>(x) {..r, ..r};\n}", 3, 35, "from one matched op only"),
    ("Pattern P {\n  let r = op<A>(x);\n  replace r with op<B>(x) {a = 1, a = 2};\n}", 3, 35, "attribute 'a' is set twice"),
    ("Pattern P {\n  let r = op<A, 2>(x);\n  replace r with x;\n}", 2, 15, "syntax error: unexpected ','"),
    ("Pattern P {\n  let r = op<A>(x);\n  replace r with op<B, 0>(x);\n}", 3, 24, "number of outputs must be at least 1"),
    ("Pattern P with benefit(-1) {\n  let r = op<A>(x);\n  replace r with x;\n}", 1, 24, "benefit must be at least 0"),
    ("Pattern P {\n  let r = op<A>(x) {a = 1e400};\n  replace r with x;\n}", 2, 25, "out of range"),
    ("Pattern P {\n  let let = op<A>(x);\n  replace r with x;\n}", 2, 7, "'let' is a reserved word"),
    ("Pattern P {\n  let r = op<A>(with);\n  replace r with x;\n}", 2, 17, "'with' is a reserved word"),
    ("Pattern P {\n  let _ = op<A>(x);\n  replace _ with x;\n}", 2, 7, "'_' is the wildcard"),
    (
        "Pattern P { let r = op<A>(x); replace r with x; }\nPattern P { let r = op<A>(x); replace r with x; }",
        2,
        9,
        "pattern 'P' is already defined at 1:1",
    ),
    ('Pattern P {\n  let r = op<A>(x) {a = "bad \\x escape"};\n  replace r with x;\n}', 2, 25, "unexpected character"),
]


@pytest.mark.parametrize("text, line, col, fragment", ERRORS)
def test_error_positions(text: str, line: int, col: int, fragment: str) -> None:
    message = error_of(text, "bad.pdll")
    assert _position(message) == ("bad.pdll", line, col), message
    assert fragment in message.split("\n")[0], message


def test_error_shows_source_line_and_caret() -> None:
    message = error_of("Pattern P {\n\tlet r = op<A>(x) oops;\n}", "t.pdll")
    first, source, caret = message.split("\n")
    assert first.startswith("t.pdll:2:19: syntax error: unexpected 'oops'")
    assert "expected" in first and "';'" in first
    assert source == "  \tlet r = op<A>(x) oops;"
    # The caret lines up under 'oops', keeping the tab.
    assert caret == "  \t" + " " * 17 + "^"


# ------------------------------------------------------------------ fuzzing: only PatternError, never a crash


def _parse_or_pattern_error(text: str) -> None:
    try:
        parse_pdll(text, "fuzz.pdll")
    except PatternError as e:
        assert re.match(r"^fuzz\.pdll:\d+:\d+: ", str(e)), str(e)


_TOKENS = st.sampled_from(
    [
        "Pattern", "Constraint", "Rewrite", "let", "op", "alt", "replace", "rewrite", "with", "benefit", "default",
        "true", "false", "x", "_", "r", "Const", "Rank", "DType", "<", ">", "(", ")", "{", "}", "[", "]", ",", ";",
        ":", "=", ".", "..", "?", "->", "1", "-2", "1.5e3", '"s"', "//c\n", "///d\n", "\n", " ",
    ]
)  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_fuzz_random_text(text: str) -> None:
    _parse_or_pattern_error(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_TOKENS, max_size=60).map(" ".join))
def test_fuzz_random_tokens(text: str) -> None:
    _parse_or_pattern_error(text)


_VALID = (
    FOLD_BN
    + """
Pattern Everything with benefit(0) {
  let s = op<Split>(x: [Const, Rank<4>])[1];
  let m = alt kind { mm: op<MatMul>(s, b?: DType<f16, "x y">), gemm: op<Gemm>(s, b, _?) };
  let r = op<com.microsoft.Add>(m, op<Relu>(s) {alpha = a default 0.5, beta = [1, [2.0]] default []});
  Check(s, kind, "lit");
  rewrite r with {
    let f = FoldBN(x, b, s, s, s, s, a);
    replace r with (op<graphopt.Fused, 2>(f.w, _, 1e-5) {..r, k = kind, c = Helper(f.b)}, s);
  };
}
"""
)


@st.composite
def _mutations(draw: st.DrawFn) -> str:
    text = _VALID
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "replace", "truncate", "swap"]))
        i = draw(st.integers(0, len(text)))
        if kind == "truncate":
            text = text[:i]
        elif kind == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 12)) :]
        elif kind == "insert":
            text = text[:i] + draw(st.one_of(_TOKENS, st.text(max_size=3))) + text[i:]
        elif kind == "replace":
            text = text[:i] + draw(_TOKENS) + text[i + draw(st.integers(1, 8)) :]
        else:
            j = draw(st.integers(0, len(text)))
            a, b = sorted((i, j))
            text = text[:a] + text[b:] + text[a:b]
    return text


def test_valid_fuzz_seed_parses() -> None:
    assert [r.name for r in parse_pdll(_VALID, "v.pdll").rules] == ["FoldConvBatchNorm", "DropIdentityCast", "Everything"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutations())
def test_fuzz_mutated_valid_file(text: str) -> None:
    _parse_or_pattern_error(text)


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    text = "Pattern P { let r = op<A>(x) {a = " + "[" * 5000 + "]" * 5000 + "}; replace r with x; }"
    _parse_or_pattern_error(text)


# ------------------------------------------------------------------ loader


def _unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def _write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_load_directory_imports_python_helpers_first(tmp_path: Path) -> None:
    check, fold = _unique("Check"), _unique("Fold")
    _write(
        tmp_path,
        "helpers.py",
        f"""
        from graphopt.pattern.native import native_constraint, native_rewrite

        @native_constraint("{check}")
        def check(ctx, x):
            return True

        @native_rewrite("{fold}")
        def fold(ctx, x):
            return x
        """,
    )
    _write(tmp_path, "b.pdll", f"Rewrite {fold}(x);\nPattern B {{ let r = op<Neg>(x); replace r with {fold}(x); }}\n")
    _write(tmp_path, "a.pdll", f"Pattern A {{ let r = op<Relu>(x); {check}(x); replace r with x; }}\n")
    _write(tmp_path, "notes.txt", "not a pattern")
    rules = load_patterns(tmp_path)
    assert [r.name for r in rules] == ["A", "B"]  # .pdll files sorted by name
    assert rules[0].loc == SourceLoc(str(tmp_path / "a.pdll"), 1, 1)
    assert load_patterns(str(tmp_path / "a.pdll"))[0].name == "A"  # a single file, as str


def test_unresolved_declared_native_fails_at_its_declaration(tmp_path: Path) -> None:
    name = _unique("Missing")
    path = _write(tmp_path, "p.pdll", f"// header\n  Constraint {name}(x);\n")
    with pytest.raises(PatternError) as info:
        load_patterns(path)
    assert str(info.value).startswith(f"{path}:2:3: Constraint '{name}' has no Python implementation")


def test_unresolved_called_native_fails_at_the_call(tmp_path: Path) -> None:
    name = _unique("Missing")
    path = _write(tmp_path, "p.pdll", f"Pattern P {{\n  let r = op<A>(x);\n  replace r with op<B>({name}(x));\n}}\n")
    with pytest.raises(PatternError) as info:
        load_patterns(tmp_path)
    assert str(info.value).startswith(f"{path}:3:24: Rewrite '{name}' has no Python implementation")


def test_native_registered_under_the_other_kind_is_not_enough(tmp_path: Path) -> None:
    from graphopt.pattern.native import native_rewrite

    name = _unique("OnlyRewrite")
    native_rewrite(name)(lambda ctx, x: x)
    path = _write(tmp_path, "p.pdll", f"Pattern P {{\n  let r = op<A>(x);\n  {name}(x);\n  replace r with x;\n}}\n")
    with pytest.raises(PatternError, match=r":3:3: Constraint .* \(a Rewrite of that name is registered\)"):
        load_patterns(path)


def test_duplicate_rule_names_across_files_name_both_locations(tmp_path: Path) -> None:
    _write(tmp_path, "a.pdll", "Pattern Same { let r = op<A>(x); replace r with x; }\n")
    _write(tmp_path, "b.pdll", "\nPattern Same { let r = op<B>(x); replace r with x; }\n")
    with pytest.raises(PatternError) as info:
        load_patterns(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'b.pdll'}:2:1: duplicate rule name 'Same'")
    assert f"{tmp_path / 'a.pdll'}:1:1" in message


def test_loader_reports_python_import_errors_with_location(tmp_path: Path) -> None:
    path = _write(tmp_path, "broken.py", "x = 1\nraise RuntimeError('boom')\n")
    with pytest.raises(PatternError, match=r"broken\.py:2:1: importing failed: RuntimeError: boom"):
        load_patterns(tmp_path)
    path.write_text("def f(:\n")
    with pytest.raises(PatternError, match=r"broken\.py:1:\d+: SyntaxError"):
        load_patterns(tmp_path)


def test_loader_skips_test_files_and_reports_bad_paths(tmp_path: Path) -> None:
    _write(tmp_path, "test_rules.py", "raise RuntimeError('must not be imported')\n")
    _write(tmp_path, "conftest.py", "raise RuntimeError('must not be imported')\n")
    assert load_patterns(tmp_path) == []
    with pytest.raises(PatternError, match="no such file or directory"):
        load_patterns(tmp_path / "nope")
    with pytest.raises(PatternError, match="expected a directory, a .pdll file or a .py file"):
        load_patterns(_write(tmp_path, "x.txt", ""))


def test_loader_parse_errors_carry_the_file_path(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.pdll", "Pattern P {\n")
    with pytest.raises(PatternError) as info:
        load_patterns(tmp_path)
    assert str(info.value).startswith(f"{path}:1:12: syntax error")


def test_loader_rejects_invalid_utf8(tmp_path: Path) -> None:
    (tmp_path / "bin.pdll").write_bytes(b"// ok\nab\xffcd\n")
    with pytest.raises(PatternError, match=r"bin\.pdll:2:3: file is not valid UTF-8"):
        load_patterns(tmp_path)


def test_strip_locations_helper_sanity() -> None:
    # Rule equality compares loc but not natives: the round-trip tests rely on both facts.
    a = rule_of("Pattern P { let r = op<A>(x); F(x); replace r with x; }", "one.pdll")
    b = rule_of("\nPattern P { let r = op<A>(x); F(x); replace r with x; }", "two.pdll")
    assert a != b
    assert dataclasses.replace(a, loc=None) == dataclasses.replace(b, loc=None)
    assert a.natives != b.natives


def test_the_language_reference_example_parses() -> None:
    doc = Path(__file__).resolve().parents[1] / "docs" / "pattern-language.md"
    blocks = re.findall(r"```\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)
    pf = parse_pdll(blocks[0], str(doc))
    assert [r.name for r in pf.rules] == ["FoldConvBatchNorm"]
    assert pf.rules[0].doc == "Conv followed by inference BatchNormalization -> one Conv with folded weights"


def test_shared_interior_op_parses_and_round_trips() -> None:
    from graphopt.pattern.printer import print_pattern_file

    text = """
Rewrite Dims(x) -> (value);
Pattern P {
  let s = shared op<Shape>(x);
  let g = op<Gather>(s, i);
  rewrite g with { let d = Dims(x); replace g with d.value; };
}
"""
    pf = parse_pdll(text, "shared.pdll")
    shape = pf.rules[0].root.operands[0]
    assert shape.op_type == "Shape" and shape.shared
    assert not pf.rules[0].root.shared
    again = parse_pdll(print_pattern_file(pf), "again.pdll")
    assert again.rules[0].root.operands[0].shared


# ----------------------------------------------------------------------------- `alt` in rewrites


_CHOOSE = """
Pattern NegOfActivation {
  let m = alt form { relu: op<Relu>(x), sig: op<Sigmoid>(x) };
  let out = op<Neg>(m);
  replace out with alt form { relu: op<Abs>(x), sig: op<Exp>(x) };
}
"""


def test_alt_in_a_rewrite_builds_the_matched_branch(tmp_path) -> None:
    from onnx import TensorProto, helper

    import graphopt
    from tests.rule_testing import make_model

    rules = tmp_path / "choose.pdll"
    rules.write_text(_CHOOSE)
    for act, expected in (("Relu", "Abs"), ("Sigmoid", "Exp")):
        model = make_model(
            [helper.make_node(act, ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        )
        optimized, report = graphopt.optimize(model, patterns=[str(rules)], builtin=False, target="onnx")
        assert [n.op_type for n in optimized.graph.node] == [expected]  # a test of the language, not a valid fusion


@pytest.mark.parametrize(
    "body, message",
    [
        ("replace out with alt form { relu: x, other: x };", "have no branch 'other'"),
        ("replace out with alt form { relu: x };", "no value for branch sig"),
        ("replace out with alt x { a: x };", "chooses by an alternative's tag"),
    ],
)
def test_alt_in_a_rewrite_is_checked(body: str, message: str) -> None:
    from graphopt.errors import PatternError
    from graphopt.pattern.pdll import parse_pdll

    text = _CHOOSE.replace("replace out with alt form { relu: op<Abs>(x), sig: op<Exp>(x) };", body)
    with pytest.raises(PatternError, match=message):
        parse_pdll(text)
