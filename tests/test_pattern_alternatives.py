"""Rules that say what they mean: op alternatives (root included) with the matched type
usable in the rewrite, opset guards and opset choices, `first { ... }` by target, typed
native helpers checked at load time, and early reject counted in the report."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest
from rule_testing import TensorProto, assert_same_outputs, helper, make_model

import graphopt
from graphopt.errors import PatternError
from graphopt.match.rewrite import target_variants
from graphopt.pattern import load_patterns, parse_pdll, print_pattern_file
from graphopt.pattern.ir import Build, FirstOf, OpMatch, OpsetChoose, OpsetGuard, Replace
from graphopt.pattern.native import Tag, Value, native_rewrite
from graphopt.pattern.python import by_opset, first_of, op, replace, rule, type_of
from graphopt.report.render import report_to_json

# One rule for three activations: drop an Identity in front of any of them, keeping the activation.
DROP_IDENTITY = """
/// Relu, Tanh or Sigmoid of an Identity -> the same activation of the Identity's input
Pattern ActivationOfIdentity {
  let act = op<kind: Relu|Tanh|Sigmoid>(op<Identity>(x));
  replace act with op<kind>(x);
}
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def activations_model(*ops: str) -> onnx.ModelProto:
    """One Identity -> activation chain per op, each on its own input (CSE would merge
    Identities of one input into one node with several users)."""
    nodes, inputs, outputs = [], [], []
    for i, op_type in enumerate(ops):
        nodes += [helper.make_node("Identity", [f"x{i}"], [f"i{i}"]), helper.make_node(op_type, [f"i{i}"], [f"y{i}"])]
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [2, 3]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    return make_model(nodes, inputs, outputs)


# ------------------------------------------------------------------ the text form


def test_op_alternatives_and_type_binding_parse_and_print_back() -> None:
    (r,) = parse_pdll(DROP_IDENTITY).rules
    assert isinstance(r.root, OpMatch)
    assert r.root_keys == (("", "Relu"), ("", "Tanh"), ("", "Sigmoid")) and r.root.type_bind == "kind"
    (stmt,) = r.body
    assert isinstance(stmt, Replace) and isinstance(stmt.values[0], Build) and stmt.values[0].type_ref == "kind"
    printed = print_pattern_file(parse_pdll(DROP_IDENTITY))
    assert "op<kind: Relu|Tanh|Sigmoid>(op<Identity>(x))" in printed and "op<kind>(x)" in printed
    assert [dataclasses.replace(r, loc=None) for r in parse_pdll(printed).rules] == [dataclasses.replace(r, loc=None)]


def test_guards_and_opset_choices_parse_and_print_back() -> None:
    text = """
    Pattern P {
      let r = op<Relu|graphopt.FastGelu>(x);
      where opset >= 13;
      where opset < 20;
      where opset(com.microsoft) == 1;
      replace r with first { alt opset { >= 18: op<Relu>(x), <= 17: op<Abs>(x) }, op<Neg>(x) };
    }
    """
    (r,) = parse_pdll(text).rules
    assert r.guards == (OpsetGuard("", 13, None), OpsetGuard("", None, 19), OpsetGuard("com.microsoft", 1, 1))
    value = r.body[0].values[0]  # type: ignore[union-attr]
    assert isinstance(value, FirstOf) and isinstance(value.options[0], OpsetChoose)
    assert [dataclasses.replace(p, loc=None) for p in parse_pdll(print_pattern_file(parse_pdll(text))).rules] == [dataclasses.replace(r, loc=None)]
    assert [len(v.body) for v in target_variants(r)] == [1, 1]  # one variant per option of `first`


@pytest.mark.parametrize(
    "text, message",
    [
        ("Pattern P { let r = op<Relu|Relu>(x); replace r with x; }", "listed twice"),
        ("Pattern P { let r = op<k: Relu>(k); replace r with x; }", "op type binding"),
        ("Constraint C(a: shape);\nPattern P { let r = op<Relu>(x); C(x); replace r with x; }", "unknown kind 'shape'"),
        ("Constraint C(a: tag);\nPattern P { let r = op<Relu>(x); C(x); replace r with x; }", "parameter 'a' is a tag"),
        ("Rewrite F(a) -> (n: attr);\nPattern P { let r = op<Relu>(x); rewrite r with { let f = F(x); replace r with op<Neg>(f.n); }; }",
         "'n' is declared as an attr"),
        ("Rewrite F(a) -> (w: value);\nPattern P { let r = op<Relu>(x); rewrite r with { let f = F(x); replace r with op<Neg>(x) {alpha = f.w}; }; }",
         "declared as a value, not an attr"),
    ],
)
def test_wrong_uses_are_errors_with_a_position(text: str, message: str) -> None:
    with pytest.raises(PatternError, match=r"^x\.pdll:\d+:\d+: ") as info:
        parse_pdll(text, "x.pdll")
    assert message in str(info.value)


# ------------------------------------------------------------------ the Python form gives the same IR


@rule
def ActivationOfIdentity(x):
    """Relu, Tanh or Sigmoid of an Identity -> the same activation of the Identity's input"""
    act = op.one_of("Relu", "Tanh", "Sigmoid", bind="kind")(op.Identity(x))
    return replace(act, op.same_as(type_of("kind"))(x))


@rule(where=("opset >= 13", "opset < 20"))
def P(x):
    r = op.one_of("Relu", "graphopt.FastGelu")(x)
    return replace(r, first_of(by_opset({">= 18": op.Relu(x), "<= 17": op.Abs(x)}), op.Neg(x)))


def test_python_form_builds_the_same_rules() -> None:
    def plain(r):  # locations and docs aside
        return (r.name, r.root, r.body, r.constraints, r.guards)

    (text_rule,) = parse_pdll(DROP_IDENTITY).rules
    assert plain(ActivationOfIdentity) == plain(text_rule)
    (guarded,) = parse_pdll("""
    Pattern P {
      let r = op<Relu|graphopt.FastGelu>(x);
      where opset >= 13;
      where opset < 20;
      replace r with first { alt opset { >= 18: op<Relu>(x), <= 17: op<Abs>(x) }, op<Neg>(x) };
    }""").rules
    assert plain(P) == plain(guarded)


# ------------------------------------------------------------------ matching and the report


def test_a_root_of_alternatives_applies_to_each_and_the_report_names_the_type(tmp_path: Path) -> None:
    path = _write(tmp_path, "drop.pdll", DROP_IDENTITY)
    model = activations_model("Relu", "Sigmoid", "Tanh")
    optimized, report = graphopt.optimize(model, patterns=[path], enable=["ActivationOfIdentity"])
    stats = report.rules["ActivationOfIdentity"]
    assert stats.applications == 3
    assert sorted(r.op for r in stats.rewrites) == ["Relu", "Sigmoid", "Tanh"]
    assert sorted(n.op_type for n in optimized.graph.node) == ["Relu", "Sigmoid", "Tanh"]
    assert_same_outputs(model, optimized)


def test_a_rule_whose_ops_are_absent_is_skipped_and_counted(tmp_path: Path) -> None:
    # FuseConvActivation needs a Conv (or a FusedConv): in a graph without one it is not tried at the Relu.
    model = activations_model("Relu", "Relu")
    _, report = graphopt.optimize(model, target="ort-cpu", enable=["FuseConvActivation"])
    stats = report.rules["FuseConvActivation"]
    assert stats.attempts == 0 and stats.skipped == 2
    rules = {r["name"]: r for r in json.loads(report_to_json(report))["rules"]}
    assert rules["FuseConvActivation"]["skipped"] == 2


def test_a_rule_whose_ops_are_present_is_tried(tmp_path: Path) -> None:
    path = _write(tmp_path, "drop.pdll", DROP_IDENTITY)
    _, report = graphopt.optimize(activations_model("Relu"), patterns=[path], enable=["ActivationOfIdentity"])
    stats = report.rules["ActivationOfIdentity"]
    assert stats.attempts >= 1 and stats.applications == 1
    # A later sweep finds no Identity left: the new Relu is not tried again, only counted.
    assert stats.skipped >= 1


def test_an_opset_guard_says_why_in_the_near_misses(tmp_path: Path) -> None:
    path = _write(tmp_path, "guarded.pdll", DROP_IDENTITY.replace("  replace act", "  where opset >= 99;\n  replace act"))
    optimized, report = graphopt.optimize(activations_model("Relu"), patterns=[path], enable=["ActivationOfIdentity"])
    stats = report.rules["ActivationOfIdentity"]
    assert stats.applications == 0 and "the model's opset is 17; the rule needs opset >= 99" in stats.near_misses[0].reason
    assert [n.op_type for n in optimized.graph.node] == ["Identity", "Relu"]


# ------------------------------------------------------------------ typed native helpers


@dataclass(frozen=True)
class _KeepArgs:
    x: Value
    form: Tag


@native_rewrite("TypedKeepForTest", params=_KeepArgs)
def _typed_keep(ctx, m: _KeepArgs):
    assert isinstance(m, _KeepArgs)  # named fields, not a positional bag
    return {"y": m.x}


@pytest.mark.parametrize(
    "decl, message",
    [
        ("Rewrite TypedKeepForTest(x, shape) -> (y);", "declared with parameters (x, shape), but its Python declaration _KeepArgs"),
        ("Rewrite TypedKeepForTest(x: value, form: attr) -> (y);", "'form' is declared as a attr, but _KeepArgs.form is a tag"),
    ],
)
def test_a_declaration_that_disagrees_with_python_is_a_load_error(tmp_path: Path, decl: str, message: str) -> None:
    text = decl + "\nPattern UsesTyped {\n  let r = op<Relu>(x);\n  rewrite r with { let f = TypedKeepForTest(x, \"a\"); replace r with f.y; };\n}\n"
    path = _write(tmp_path, "typed.pdll", text)
    with pytest.raises(PatternError) as info:
        load_patterns(path)
    assert str(info.value).startswith(f"{path}:1:1: Rewrite 'TypedKeepForTest'") and message in str(info.value)


def test_a_helper_with_the_wrong_arity_is_a_load_error_on_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "helpers.py").write_text(textwrap.dedent('''
        from graphopt.pattern.native import native_constraint

        @native_constraint("TwoArgsForTest")
        def two_args(ctx, a, b):
            return True
    '''))
    _write(tmp_path, "rule.pdll", """
        Constraint TwoArgsForTest(a);
        Pattern UsesTwoArgs {
          let r = op<Relu>(x);
          TwoArgsForTest(x);
          replace r with x;
        }
    """)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(activations_model("Relu"), src)
    done = subprocess.run(
        [sys.executable, "-m", "graphopt", "optimize", str(src), "-o", str(out), "--patterns", str(tmp_path), "--quiet"],
        capture_output=True, text=True,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and "rule.pdll:2:1: Constraint 'TwoArgsForTest' is declared with 1 parameter(s)" in lines[0]
    assert "Traceback" not in done.stderr and not out.exists()
