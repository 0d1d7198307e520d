"""Golden tests for cleanup.pdll: Identity, inference Dropout, one-input Concat, Constant nodes."""

from __future__ import annotations

import numpy as np
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, rewrites

F = TensorProto.FLOAT
RULES = ["DropIdentity", "DropInferenceDropout", "DropSingleInputConcat", "ConstantNodeToInitializer"]


def test_identity_dropout_concat_go() -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["i"]), helper.make_node("Dropout", ["i"], ["d"]),
         helper.make_node("Concat", ["d"], ["c"], axis=1), helper.make_node("Sigmoid", ["c"], ["y"])],
        [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, None)], opset=13)
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "DropIdentity") == 1 and rewrites(report, "DropInferenceDropout") == 1
    assert rewrites(report, "DropSingleInputConcat") == 1
    assert op_types(optimized) == ["Relu", "Sigmoid"]
    assert_same_outputs(model, optimized)


def test_identity_as_graph_output_keeps_the_output_name() -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])],
                       [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, None)])
    optimized, _ = optimize_with(model, RULES)
    assert [o.name for o in optimized.graph.output] == ["y"]
    assert_same_outputs(model, optimized)


def test_training_dropout_stays() -> None:
    model = make_model([helper.make_node("Dropout", ["x", "ratio", "train"], ["y"], seed=1)],
                       [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, None)],
                       [init("ratio", np.array(0.5, np.float32)), init("train", np.array(True))], opset=13)
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "DropInferenceDropout") == 0
    assert op_types(optimized) == ["Dropout"]


def test_constant_nodes_become_initializers() -> None:
    model = make_model(
        [helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", F, [3], [1.0, 2.0, 3.0])),
         helper.make_node("Add", ["x", "k"], ["y"])],
        [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, None)])
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "ConstantNodeToInitializer") == 1
    assert op_types(optimized) == ["Add"] and len(optimized.graph.initializer) == 1
    assert_same_outputs(model, optimized)


def test_constant_nodes_in_subgraphs_stay() -> None:
    then_graph = helper.make_graph([helper.make_node("Constant", [], ["t"], value=helper.make_tensor("tv", F, [1], [1.0]))], "then", [],
                                   [helper.make_tensor_value_info("t", F, [1])])
    else_graph = helper.make_graph([helper.make_node("Constant", [], ["e"], value=helper.make_tensor("ev", F, [1], [2.0]))], "else", [],
                                   [helper.make_tensor_value_info("e", F, [1])])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)],
                       [helper.make_tensor_value_info("c", TensorProto.BOOL, [])], [helper.make_tensor_value_info("y", F, None)])
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "ConstantNodeToInitializer") == 0
    assert [n.op_type for n in optimized.graph.node[0].attribute[0].g.node] == ["Constant"]
    assert_same_outputs(model, optimized, feeds={"c": np.array(True)})
