"""Inlining Ifs whose condition is constant."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper
from rule_testing import assert_same_outputs, init, make_model

from graphopt.ir.onnx_view import OnnxView
from graphopt.passes import inline_constant_ifs

F = TensorProto.FLOAT


def if_model(condition: np.ndarray | None, then_returns_outer: bool = False):
    then_nodes = [] if then_returns_outer else [helper.make_node("Neg", ["x"], ["t"])]
    then_graph = helper.make_graph(then_nodes, "then", [], [helper.make_tensor_value_info("x" if then_returns_outer else "t", F, [2])])
    else_graph = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, [2])])
    inputs = [helper.make_tensor_value_info("x", F, [2])]
    inits = []
    if condition is None:
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    else:
        inits.append(init("c", condition))
    return make_model([helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)], inputs,
                      [helper.make_tensor_value_info("y", F, None)], inits)


def run_pass(proto):
    model = ir.serde.deserialize_model(proto)
    count = inline_constant_ifs(OnnxView(model))
    return count, ir.serde.serialize_model(model)


def test_constant_true_inlines_then_branch() -> None:
    proto = if_model(np.array(True))
    count, out = run_pass(proto)
    assert count == 1
    assert [n.op_type for n in out.graph.node] == ["Neg"]
    assert [o.name for o in out.graph.output] == ["y"]
    assert_same_outputs(proto, out)


def test_constant_false_inlines_else_branch() -> None:
    proto = if_model(np.array([False]))
    count, out = run_pass(proto)
    assert count == 1 and [n.op_type for n in out.graph.node] == ["Abs"]
    assert_same_outputs(proto, out)


def test_branch_returning_an_outer_value_keeps_the_output_name() -> None:
    proto = if_model(np.array(True), then_returns_outer=True)
    count, out = run_pass(proto)
    assert count == 1 and [n.op_type for n in out.graph.node] == ["Identity"]
    assert [o.name for o in out.graph.output] == ["y"]
    # onnxruntime refuses the original (a branch may not return an outer value directly).
    from rule_testing import run

    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(run(out, {"x": x})[0], x)


def test_condition_from_an_input_is_left_alone() -> None:
    count, out = run_pass(if_model(None))
    assert count == 0 and [n.op_type for n in out.graph.node] == ["If"]
