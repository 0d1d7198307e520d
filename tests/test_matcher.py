"""The matcher and driver on hand-built pattern IR: commutativity, alternatives,
optional operands, repeated names, single-use interiors, near-miss depth, and
the worklist's linear behaviour."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper
from rule_testing import init, make_model

from graphopt.ir.onnx_view import OnnxView
from graphopt.match.driver import DriverOptions, RuleSet, apply_rules
from graphopt.match.matcher import Failure, Match, Matcher
from graphopt.ops.targets import get_target
from graphopt.pattern.ir import AltMatch, AttrMatch, Build, OpMatch, Ref, Replace, Rule, ValueConstraint, Var

F = TensorProto.FLOAT


def view_of(nodes, inputs=("x",), outputs=("y",), inits=()):
    model = make_model(
        nodes,
        [helper.make_tensor_value_info(n, F, [2, 3]) for n in inputs],
        [helper.make_tensor_value_info(n, F, None) for n in outputs],
        list(inits),
    )
    return OnnxView(ir.serde.deserialize_model(model))


def node_named(view, name):
    return next(n for n in view.iter_all_nodes() if n.name == name)


def silu_rule(name="Silu"):
    # Mul(x, Sigmoid(x)) -> graphopt-free stand-in: replace with Relu(x) (structure is what we test)
    root = OpMatch("Mul", operands=(Var("x"), OpMatch("Sigmoid", operands=(Var("x"),))), name="mul")
    return Rule(name, root, (Replace("mul", (Build("Relu", operands=(Ref("x"),)),)),))


def test_commutative_operands_match_in_either_order_without_cloning() -> None:
    for order in (["x", "s"], ["s", "x"]):
        view = view_of([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", order, ["y"], name="mul")])
        result = Matcher(view).attempt(silu_rule(), node_named(view, "mul"))
        assert isinstance(result, Match), order


def test_repeated_name_must_bind_the_same_value() -> None:
    view = view_of(
        [helper.make_node("Sigmoid", ["x2"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"], name="mul")],
        inputs=("x", "x2"),
    )
    result = Matcher(view).attempt(silu_rule(), node_named(view, "mul"))
    assert isinstance(result, Failure)
    assert "same value" in result.reason


def test_interior_with_outside_user_is_rejected_and_reported_deepest() -> None:
    view = view_of(
        [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"), helper.make_node("Mul", ["x", "s"], ["y"], name="mul"), helper.make_node("Neg", ["s"], ["z"])],
        outputs=("y", "z"),
    )
    result = Matcher(view).attempt(silu_rule(), node_named(view, "mul"))
    assert isinstance(result, Failure)
    assert "another user" in result.reason and result.depth == 3


def test_alternatives_bind_the_tag_that_matched() -> None:
    act = AltMatch("kind", (("relu", OpMatch("Relu", operands=(Var("x"),))), ("tanh", OpMatch("Tanh", operands=(Var("x"),)))))
    root = OpMatch("Neg", operands=(act,), name="neg")
    rule = Rule("NegAct", root, (Replace("neg", (Ref("x"),)),))
    for op, tag in (("Relu", "relu"), ("Tanh", "tanh")):
        view = view_of([helper.make_node(op, ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"], name="neg")])
        result = Matcher(view).attempt(rule, node_named(view, "neg"))
        assert isinstance(result, Match) and result.bindings["kind"] == tag
    view = view_of([helper.make_node("Sigmoid", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"], name="neg")])
    assert isinstance(Matcher(view).attempt(rule, node_named(view, "neg")), Failure)


def test_optional_operand_binds_none_when_absent() -> None:
    root = OpMatch("Clip", operands=(Var("x"), Var("lo", optional=True), Var("hi", optional=True)), name="clip")
    rule = Rule("Clip", root, (Replace("clip", (Ref("x"),)),))
    view = view_of([helper.make_node("Clip", ["x", "lo"], ["y"], name="clip")], inits=[init("lo", np.array(0, np.float32))])
    result = Matcher(view).attempt(rule, node_named(view, "clip"))
    assert isinstance(result, Match)
    assert result.bindings["hi"] is None and result.bindings["lo"] is not None


def test_attribute_literal_uses_schema_default_and_reports_mismatch() -> None:
    root = OpMatch("LeakyRelu", operands=(Var("x"),), attrs=(AttrMatch("alpha", literal=0.01),), name="lr")
    rule = Rule("LR", root, (Replace("lr", (Ref("x"),)),))
    view = view_of([helper.make_node("LeakyRelu", ["x"], ["y"], name="lr")])  # alpha defaults to 0.01
    assert isinstance(Matcher(view).attempt(rule, node_named(view, "lr")), Match)
    view = view_of([helper.make_node("LeakyRelu", ["x"], ["y"], name="lr", alpha=0.2)])
    failure = Matcher(view).attempt(rule, node_named(view, "lr"))
    assert isinstance(failure, Failure) and "alpha = 0.2" in failure.reason


def test_value_constraints() -> None:
    const = OpMatch("Add", operands=(Var("x"), Var("c", (ValueConstraint("Const"), ValueConstraint("Scalar")))), name="add")
    rule = Rule("AddConst", const, (Replace("add", (Ref("x"),)),))
    view = view_of([helper.make_node("Add", ["x", "c"], ["y"], name="add")], inits=[init("c", np.array(1, np.float32))])
    assert isinstance(Matcher(view).attempt(rule, node_named(view, "add")), Match)
    view = view_of([helper.make_node("Add", ["x", "c"], ["y"], name="add")], inits=[init("c", np.ones(3, np.float32))])
    failure = Matcher(view).attempt(rule, node_named(view, "add"))
    assert isinstance(failure, Failure) and "scalar" in failure.reason


def test_driver_rewrites_a_long_chain_linearly() -> None:
    # Neg(Neg(x)) -> x applied down a chain of 2000 Negs: each rewrite re-queues only
    # its neighbourhood, so attempts stay proportional to the chain's length.
    n = 2000
    nodes = [helper.make_node("Neg", [f"v{i}"], [f"v{i + 1}"]) for i in range(n)]
    nodes.append(helper.make_node("Identity", [f"v{n}"], ["y"]))
    model = make_model(nodes, [helper.make_tensor_value_info("v0", F, [2])], [helper.make_tensor_value_info("y", F, None)])
    view = OnnxView(ir.serde.deserialize_model(model))
    root = OpMatch("Neg", operands=(OpMatch("Neg", operands=(Var("x"),)),), name="outer")
    rule = Rule("DoubleNeg", root, (Replace("outer", (Ref("x"),)),))
    from graphopt.report.model import Report

    report = Report("onnx")
    applied = apply_rules(view, RuleSet([rule]), get_target("onnx"), report, DriverOptions())
    assert applied == n // 2
    assert [node.op_type for node in view.model.graph] == ["Identity"]
    assert report.rules["DoubleNeg"].attempts <= 3 * n


def test_rewrite_budget_is_reported_not_fatal() -> None:
    nodes = [helper.make_node("Neg", [f"v{i}"], [f"v{i + 1}"]) for i in range(10)]
    nodes.append(helper.make_node("Identity", ["v10"], ["y"]))
    model = make_model(nodes, [helper.make_tensor_value_info("v0", F, [2])], [helper.make_tensor_value_info("y", F, None)])
    view = OnnxView(ir.serde.deserialize_model(model))
    root = OpMatch("Neg", operands=(OpMatch("Neg", operands=(Var("x"),)),), name="outer")
    from graphopt.report.model import Report

    report = Report("onnx")
    applied = apply_rules(view, RuleSet([Rule("DoubleNeg", root, (Replace("outer", (Ref("x"),)),))]), get_target("onnx"), report, DriverOptions(max_rewrites=2))
    assert applied == 2 and report.limit_reached
