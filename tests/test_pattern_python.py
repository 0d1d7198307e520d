"""The embedded Python front end: the same ir.Rule as the equivalent .pdll text, and clear errors."""

from __future__ import annotations

import dataclasses
import re
import textwrap
import uuid
from pathlib import Path

import pytest

from graphopt.errors import PatternError
from graphopt.pattern import load_patterns, parse_pdll
from graphopt.pattern.ir import NativeDecl, OpMatch, Rule, SourceLoc, ValueConstraint, Var
from graphopt.pattern.python import (
    ANY,
    RULES,
    Const,
    DType,
    OneUse,
    Optional,
    Rank,
    Scalar,
    alt,
    attr,
    native,
    op,
    replace,
    rule,
    wildcard,
)


def strip(r: Rule) -> Rule:
    return dataclasses.replace(r, loc=None)


def pdll(text: str) -> Rule:
    (r,) = parse_pdll(textwrap.dedent(text), "eq.pdll").rules
    return r


def assert_same(py_rule: Rule, text: str) -> None:
    expected = pdll(text)
    assert strip(py_rule) == strip(expected)
    assert repr(strip(dataclasses.replace(py_rule, natives=()))) == repr(strip(dataclasses.replace(expected, natives=())))


def error_of(build) -> str:
    with pytest.raises(PatternError) as info:
        build()
    return str(info.value)


# ------------------------------------------------------------------ rules defined at import, like a rules/*.py file


@rule(benefit=3)
def FoldConvBatchNorm(x, w: Const, b: Optional[Const], g: Const, beta: Const, mean: Const, var: Const):
    """Conv followed by inference BatchNormalization -> one Conv with folded weights

    Only the first line of the docstring is the rule's doc.
    """
    conv = op.Conv(x, w, b)
    bn = op.BatchNormalization(conv, g, beta, mean, var).attrs(epsilon=attr("eps"), training_mode=0)
    native.SameRank(w, g).require()
    f = native.FoldBN(w, b, g, beta, mean, var, attr("eps"))
    return replace(bn, op.Conv(x, f.w, f.b).copy_attrs(conv))


FOLD_BN_PDLL = """
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
"""


@rule
def DropIdentityCast(x: DType["f32"]):  # noqa: F821, UP037  (linters read the string as a forward reference)
    c = op.Cast(x).attrs(to=1)
    return replace(c, x)


DROP_CAST_PDLL = """
    Pattern DropIdentityCast {
      let c = op<Cast>(x: DType<f32>) {to = 1};
      replace c with x;
    }
"""


@rule(name="AttentionVariants")
def attention(q, k, v, scale: (Const, Scalar)):
    scores = alt("form", mm=op.MatMul(q, k), gemm=op.Gemm(q, k, wildcard(optional=True)))
    scaled = op.Mul(scores, scale)
    probs = op.Softmax(scaled).attrs(axis=attr("axis", default=-1))
    out = op.MatMul(probs, v)
    fused = op["graphopt"].FusedAttention(q, k, v, scale).attrs(form=scores.tag, axis=attr("axis"))
    return replace(out, fused)


ATTENTION_PDLL = """
    Pattern AttentionVariants {
      let scores = alt form { mm: op<MatMul>(q, k), gemm: op<Gemm>(q, k, _?) };
      let scaled = op<Mul>(scores, scale: [Const, Scalar]);
      let probs = op<Softmax>(scaled) {axis = axis default -1};
      let out = op<MatMul>(probs, v);
      rewrite out with {
        let fused = op<graphopt.FusedAttention>(q, k, v, scale) {form = form, axis = axis};
        replace out with fused;
      };
    }
"""

PY_RULES = [FoldConvBatchNorm, DropIdentityCast, attention]


@pytest.mark.parametrize(
    "py_rule, text",
    [(FoldConvBatchNorm, FOLD_BN_PDLL), (DropIdentityCast, DROP_CAST_PDLL), (attention, ATTENTION_PDLL)],
    ids=["fold-bn", "drop-cast", "attention"],
)
def test_python_rule_equals_pdll_rule(py_rule: Rule, text: str) -> None:
    assert_same(py_rule, text)


def test_rule_metadata() -> None:
    assert isinstance(FoldConvBatchNorm, Rule)
    assert FoldConvBatchNorm.name == "FoldConvBatchNorm" and attention.name == "AttentionVariants"
    assert FoldConvBatchNorm.benefit == 3 and DropIdentityCast.benefit is None
    assert FoldConvBatchNorm.doc == "Conv followed by inference BatchNormalization -> one Conv with folded weights"
    assert DropIdentityCast.doc == ""
    # loc is the `def` line, not the decorator's
    lines = Path(__file__).read_text().splitlines()
    loc = FoldConvBatchNorm.loc
    assert loc is not None and loc.file == __file__ and loc.col == 1
    assert lines[loc.line - 1].startswith("def FoldConvBatchNorm(") and lines[loc.line - 2].startswith("@rule")
    assert all(any(r is p for r in RULES) for p in PY_RULES)


def test_natives_are_recorded_at_their_call() -> None:
    lines = Path(__file__).read_text().splitlines()
    decls = FoldConvBatchNorm.natives
    assert [(d.kind, d.name) for d in decls] == [("Constraint", "SameRank"), ("Rewrite", "FoldBN")]
    for d in decls:
        assert d.loc is not None and d.loc.file == __file__
        assert f"native.{d.name}(" in lines[d.loc.line - 1]


def test_shared_ops_are_one_object() -> None:
    assert isinstance(FoldConvBatchNorm.root.operands[0], OpMatch)

    @rule
    def Swish(x):
        s = op.Sigmoid(x)
        return replace(op.Mul(x, op.Mul(s, s)), op["graphopt"].Swish(x))

    inner = Swish.root.operands[1]
    assert isinstance(inner, OpMatch)
    assert inner.operands[0] is inner.operands[1]


# ------------------------------------------------------------------ feature by feature against .pdll


def test_all_value_constraints_and_optional_forms() -> None:
    @rule
    def C(a: (Const, Rank[4]), b: DType("f16", "bf16"), c: OneUse, d: Optional, e: Optional[Const, Scalar], f: Rank[0]):
        r = op.F(a, b, c, d, e, f)
        return replace(r, a)

    assert_same(
        C,
        """
        Pattern C {
          let r = op<F>(a: [Const, Rank<4>], b: DType<f16, bf16>, c: OneUse, d?, e?: [Const, Scalar], f: Rank<0>);
          replace r with a;
        }
        """,
    )
    assert C.root.operands[0] == Var("a", (ValueConstraint("Const"), ValueConstraint("Rank", (4,))))


def test_constraints_on_every_occurrence_of_a_parameter() -> None:
    @rule
    def Twice(x: Const):
        r = op.Add(op.Neg(x), x)
        return replace(r, x)

    # The .pdll form writes the constraint once; both give it to every occurrence.
    assert_same(Twice, "Pattern Twice { let r = op<Add>(op<Neg>(x), x: Const); replace r with x; }")


def test_wildcards_domains_outputs_and_literals() -> None:
    @rule
    def W(x, y):
        top = (
            op["com.microsoft"]
            .FusedConv(op.Split(x)[1], ANY, wildcard(Const, optional=True), y)
            .attrs(a=1, b=-2.5, c="NOTSET", d=True, e=[1, (2, 3)], f=attr("bound"), g=attr("g2", default=[]), h=attr(equals=0, default=0))
        )
        return replace(top, y)

    assert_same(
        W,
        """
        Pattern W {
          let top = op<com.microsoft.FusedConv>(op<Split>(x)[1], _, _?: Const, y)
              {a = 1, b = -2.5, c = "NOTSET", d = true, e = [1, [2, 3]], f = bound, g = g2 default [], h = 0 default 0};
          replace top with y;
        }
        """,
    )


def test_rewrite_builds_calls_lets_and_several_values() -> None:
    @rule
    def R(x, y: Optional):
        r = op.Foo(x, y).attrs(k=attr("kv"))
        s = native.Split2(x)
        c = (
            op["graphopt"]
            .Fused(s.lo, None, y, 3)
            .copy_attrs(r)
            .attrs(alpha=1.5, beta=attr("kv"), gamma=native.Helper(s["hi"], "z"))
            .outputs(2)
        )
        return replace(r, c, [1, 2], False)

    assert_same(
        R,
        """
        Pattern R {
          let r = op<Foo>(x, y?) {k = kv};
          rewrite r with {
            let s = Split2(x);
            let c = op<graphopt.Fused, 2>(s.lo, _, y, 3) {..r, alpha = 1.5, beta = kv, gamma = Helper(s.hi, "z")};
            replace r with (c, [1, 2], false);
          };
        }
        """,
    )


def test_inline_rewrite_values_stay_inline_and_shared_ones_get_a_let() -> None:
    @rule
    def Inline(x):
        return replace(op.Relu(x), op.Clip(native.Lo(x), native.Hi(x)))

    assert_same(Inline, "Pattern Inline { let relu = op<Relu>(x); replace relu with op<Clip>(Lo(x), Hi(x)); }")

    @rule
    def Shared(x):
        r = op.Relu(x)
        t = op.Tanh(x)
        return replace(r, op.Add(t, t))

    # `t` is not a matched op (it does not feed the root): it is built, once, by a let.
    assert_same(Shared, "Pattern Shared { let r = op<Relu>(x); rewrite r with { let t = op<Tanh>(x); replace r with op<Add>(t, t); }; }")

    @rule
    def SharedUnnamed(x):
        r = op.Relu(x)
        return replace(r, [op.Add(*[native.Twice(x)] * 2)][0])

    assert_same(
        SharedUnnamed,
        "Pattern SharedUnnamed { let r = op<Relu>(x); rewrite r with { let twice = Twice(x); replace r with op<Add>(twice, twice); }; }",
    )


def _times_tanh(s):
    return op.Mul(s, op.Tanh(s))


def test_generated_names_only_where_needed() -> None:
    @rule
    def Gen(x):
        # The Sigmoid has no local name here, but it is used twice, so it needs one.
        return replace(_times_tanh(op.Sigmoid(x)), x)

    assert_same(Gen, "Pattern Gen { let sigmoid = op<Sigmoid>(x); let mul = op<Mul>(sigmoid, op<Tanh>(sigmoid)); replace mul with x; }")

    @rule
    def Clash(sigmoid):
        return replace(op.Sigmoid(sigmoid), sigmoid)

    assert Clash.root.name == "sigmoid2"


def test_rewrite_refers_to_matched_ops_and_tags() -> None:
    @rule
    def Refs(a, b):
        m = alt("kind", mm=op.MatMul(a, b), tr=op.Transpose(a))
        relu = op.Relu(m)
        native.Check(relu, m.tag, 1).require()
        return replace(relu, op.Foo(relu, m.tag))

    assert_same(
        Refs,
        """
        Pattern Refs {
          let relu = op<Relu>(alt kind { mm: op<MatMul>(a, b), tr: op<Transpose>(a) });
          Check(relu, kind, 1);
          replace relu with op<Foo>(relu, kind);
        }
        """,
    )


def test_alt_with_a_dict_of_branches_and_reused_alt_object() -> None:
    @rule
    def Dict(x):
        m = alt("t", {"relu": op.Relu(x), "tanh": op.Tanh(x)})
        root = op.Add(m, m)
        return replace(root, x)

    assert_same(
        Dict, "Pattern Dict { let m = alt t { relu: op<Relu>(x), tanh: op<Tanh>(x) }; let root = op<Add>(m, m); replace root with x; }"
    )
    assert Dict.root.operands[0] is Dict.root.operands[1]


def test_several_replaces_in_creation_order() -> None:
    @rule
    def Multi(x):
        a = op.A(x)
        r = op.B(a)
        first = replace(r, x)
        y = native.Make(x)
        return [first, replace(a, y)]

    assert_same(
        Multi,
        "Pattern Multi { let a = op<A>(x); let r = op<B>(a); rewrite r with { replace r with x; let y = Make(x); replace a with y; }; }",
    )


# ------------------------------------------------------------------ errors


def _line_of(fragment: str) -> int:
    for i, line in enumerate(Path(__file__).read_text().splitlines(), 1):
        if fragment in line:
            return i
    raise AssertionError(fragment)


def _assert_at(message: str, fragment: str) -> None:
    m = re.match(r"^(.*):(\d+):(\d+): ", message)
    assert m, message
    assert m.group(1) == __file__ and int(m.group(2)) == _line_of(fragment), message


def test_error_literal_operand_in_match() -> None:
    def build() -> None:
        @rule
        def Bad(x):
            return replace(op.Add(x, 1.0), x)  # MARK-literal-operand

    message = error_of(build)
    _assert_at(message, "MARK-literal-operand")
    assert "operand 2 of matched op.Add(...) is float 1.0" in message


def test_error_unused_parameter_points_at_def() -> None:
    def build() -> None:
        @rule
        def Unused(x, y):  # MARK-unused-param
            return replace(op.Relu(x), x)

    message = error_of(build)
    _assert_at(message, "MARK-unused-param")
    assert "parameter 'y' is not used by the match" in message


def test_error_unused_native_call_and_unconnected_op() -> None:
    def unused_native() -> None:
        @rule
        def Bad(x):
            native.Check(x)  # MARK-unused-native
            return replace(op.Relu(x), x)

    message = error_of(unused_native)
    _assert_at(message, "MARK-unused-native")
    assert "call .require()" in message

    def unconnected() -> None:
        @rule
        def Bad(x):
            op.Tanh(x)  # MARK-unconnected
            return replace(op.Relu(x), x)

    _assert_at(error_of(unconnected), "MARK-unconnected")


@pytest.mark.parametrize(
    "body, fragment",
    [
        ("return x", "must return replace(...)"),
        ("return replace(x, x)", "replace() needs an op as its first argument"),
        ("return replace(op.Relu(x), y)", "parameter 'y' is not bound by the match"),
        ("return replace(op.Relu(x), attr('nope'))", "attribute binding 'nope' is not bound"),
        ("return replace(op.Relu(x), None)", "None (an omitted input)"),
        ("return replace(op.Relu(x).attrs(a=x), x)", "attribute 'a' of matched op.Relu(...) is parameter 'x'"),
        ("return replace(op.Relu(x).attrs(a=attr()), x)", "either a name to bind or equals="),
        ("return replace(op.Relu(x).copy_attrs(op.Relu(x)), x)", "copy_attrs() and outputs() are for ops the rewrite builds"),
        ("return replace(op.Relu(x), op.Tanh(x).copy_attrs(op.Neg(x)))", "copy_attrs() takes a matched op"),
        ("return replace(op.Relu(x), op.Tanh(x)[1])", "output selection is only for matched ops"),
        ("r = native.C(x).require()\n    return replace(op.Relu(x), r)", "is a constraint (.require()) and cannot also be used"),
        ("return replace(op.Relu(x), op.Tanh(x), ANY)", "wildcard() cannot be used in the rewrite"),
        ("return replace(op.Relu(x).attrs(a=float('nan')), x)", "only finite numbers"),
        ("return replace(op.Relu(x), x), replace(op.Neg(x), x)", "only a matched op can be replaced"),
        ("x = op.Relu(x)\n    return replace(x, x)", "'x' names both parameter 'x' and matched op.Relu(...)"),
        ("m = alt('t', a=op.A(x))\n    n = alt('t', b=op.B(x))\n    return replace(op.C(m, n), x)", "two alternatives use the tag 't'"),
        ("replace(op.Relu(x), x)\n    return replace(op.Tanh(x), x)", "is not returned"),
        ("return replace(op.Relu(x), y=1)", "unexpected keyword"),
    ],
)
def test_error_messages(body: str, fragment: str) -> None:
    params = "x, y" if re.search(r"\by\b", body) else "x"
    source = f"def Bad({params}):\n    {body}\n"
    namespace: dict[str, object] = {"op": op, "native": native, "replace": replace, "attr": attr, "alt": alt, "ANY": ANY}
    exec(compile(source, "<bad-rule>", "exec"), namespace)
    fn = namespace["Bad"]
    with pytest.raises((PatternError, TypeError)) as info:
        rule(fn)
    assert fragment in str(info.value)


def test_error_bad_annotations_and_names() -> None:
    with pytest.raises(PatternError, match="Rank takes a non-negative integer"):
        Rank["4"]
    with pytest.raises(PatternError, match="DType takes element type names"):
        DType[16]

    def bad_annotation(x: int):
        return replace(op.Relu(x), x)

    with pytest.raises(PatternError, match="annotation <class 'int'> is not a value constraint"):
        rule(bad_annotation)

    def reserved(default):
        return replace(op.Relu(default), default)

    with pytest.raises(PatternError, match="parameter 'default' cannot be a value name"):
        rule(reserved)

    def kwonly(*, x):
        return replace(op.Relu(x), x)

    with pytest.raises(PatternError, match="plain positional parameters"):
        rule(kwonly)

    with pytest.raises(PatternError, match="op.Relu.* can only be used inside a @rule function"):
        op.Relu(ANY)

    with pytest.raises(PatternError, match="takes operands only; set attributes with .attrs"):

        @rule
        def Kw(x):
            return replace(op.Relu(x, alpha=1), x)


# ------------------------------------------------------------------ loading a rules/*.py file


def test_loader_collects_python_rules_and_resolves_their_natives(tmp_path: Path) -> None:
    check = f"Check{uuid.uuid4().hex[:8]}"
    (tmp_path / "fusions.py").write_text(
        textwrap.dedent(f"""
        from graphopt.pattern.native import native_constraint
        from graphopt.pattern.python import rule, op, native, replace, Const

        @native_constraint("{check}")
        def check(ctx, x):
            return True

        @rule
        def PyRule(x: Const):
            r = op.Relu(x)
            native.{check}(x).require()
            return replace(r, x)

        alias = PyRule  # the same rule twice is still one rule
        """)
    )
    (tmp_path / "more.pdll").write_text("Pattern PdllRule { let r = op<Tanh>(x); replace r with x; }\n")
    rules = load_patterns(tmp_path)
    assert [r.name for r in rules] == ["PyRule", "PdllRule"]
    assert rules[0].loc == SourceLoc(str(tmp_path / "fusions.py"), 10, 1)
    assert rules[0].natives == (NativeDecl("Constraint", check, loc=SourceLoc(str(tmp_path / "fusions.py"), 12, 5)),)


def test_loader_unresolved_native_in_python_rule_points_at_the_call(tmp_path: Path) -> None:
    name = f"Missing{uuid.uuid4().hex[:8]}"
    path = tmp_path / "p.py"
    path.write_text(
        "from graphopt.pattern.python import rule, op, native, replace\n\n"
        f"@rule\ndef P(x):\n    r = op.Relu(x)\n    return replace(r, native.{name}(x))\n"
    )
    with pytest.raises(PatternError) as info:
        load_patterns(path)
    assert str(info.value).startswith(f"{path}:6:5: Rewrite '{name}' has no Python implementation")


def test_loader_reports_pattern_errors_raised_while_importing(tmp_path: Path) -> None:
    path = tmp_path / "p.py"
    path.write_text(
        "from graphopt.pattern.python import rule, op, replace\n\n@rule\ndef P(x, unused):\n    return replace(op.Relu(x), x)\n"
    )
    with pytest.raises(PatternError, match=re.escape(f"{path}:4:1: rule P: parameter 'unused' is not used by the match")):
        load_patterns(tmp_path)
