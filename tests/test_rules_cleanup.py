"""Golden tests for cleanup.pdll: Identity, inference Dropout, one-input Concat, Constant nodes."""

from __future__ import annotations

import numpy as np
import onnx
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, rewrites

F = TensorProto.FLOAT
RULES = ["DropPassThrough", "DropInferenceDropout", "DropSingleInputConcat", "ConstantNodeToInitializer"]


def test_identity_dropout_concat_go() -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["i"]), helper.make_node("Dropout", ["i"], ["d"]),
         helper.make_node("Concat", ["d"], ["c"], axis=1), helper.make_node("Sigmoid", ["c"], ["y"])],
        [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, None)], opset=13)
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "DropPassThrough") == 1 and rewrites(report, "DropInferenceDropout") == 1
    assert rewrites(report, "DropSingleInputConcat") == 1
    assert op_types(optimized) == ["Relu", "Sigmoid"]
    assert_same_outputs(model, optimized)


def test_identity_as_graph_output_stays() -> None:
    """Dropping it would only put another Identity in its place (a loop of rewrites)."""
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])],
                       [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, None)])
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "DropPassThrough") == 0
    assert op_types(optimized) == ["Relu", "Identity"] and [o.name for o in optimized.graph.output] == ["y"]


def test_identity_on_a_loop_body_output_stays() -> None:
    body = helper.make_graph(
        [helper.make_node("Relu", ["v_in"], ["r"]), helper.make_node("Identity", ["r"], ["v_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", F, [2])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("v_out", F, [2])])
    model = make_model([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
                       [helper.make_tensor_value_info("n", TensorProto.INT64, []), helper.make_tensor_value_info("x", F, [2])],
                       [helper.make_tensor_value_info("y", F, None)])
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "DropPassThrough") == 0
    assert_same_outputs(model, optimized, feeds={"n": np.array(3, np.int64), "x": np.array([-1.0, 2.0], np.float32)})


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


NEUTRAL = ["DropNoOpResize"]


def test_resize_to_the_same_shape_goes_and_upsampling_stays() -> None:
    roi = init("roi", np.array([], np.float32))
    same = make_model([helper.make_node("Resize", ["x", "roi", "s1"], ["r"], mode="nearest"), helper.make_node("Relu", ["r"], ["y"])],
                      [helper.make_tensor_value_info("x", F, [1, 2, 4, 4])], [helper.make_tensor_value_info("y", F, None)],
                      [roi, init("s1", np.ones(4, np.float32))], opset=13)
    optimized, report = optimize_with(same, NEUTRAL)
    assert rewrites(report, "DropNoOpResize") == 1 and op_types(optimized) == ["Relu"]
    assert_same_outputs(same, optimized)
    up = make_model([helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="nearest")],
                    [helper.make_tensor_value_info("x", F, [1, 2, 4, 4])], [helper.make_tensor_value_info("y", F, None)],
                    [roi, init("sizes", np.array([1, 2, 8, 8], np.int64))], opset=13)
    optimized, report = optimize_with(up, NEUTRAL)
    assert rewrites(report, "DropNoOpResize") == 0 and op_types(optimized) == ["Resize"]


def test_squeeze_reshape_round_trip_goes() -> None:
    """tf2onnx's squeeze-excite: GlobalAveragePool [N, C, 1, 1], Squeeze to [N, C], Reshape back to [N, C, 1, 1]."""
    model = make_model(
        [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Squeeze", ["p", "axes"], ["s"]),
         helper.make_node("Reshape", ["s", "shape"], ["r"]), helper.make_node("Mul", ["x", "r"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 4, 3, 3])], [helper.make_tensor_value_info("y", F, None)],
        [init("axes", np.array([2, 3], np.int64)), init("shape", np.array([1, 4, 1, 1], np.int64))], opset=13)
    optimized, report = optimize_with(model, ["DropReshapeRoundTrip"])
    assert rewrites(report, "DropReshapeRoundTrip") == 1
    assert op_types(optimized) == ["GlobalAveragePool", "Mul"]
    assert_same_outputs(model, optimized)


def test_squeeze_reshape_to_another_shape_stays() -> None:
    model = make_model(
        [helper.make_node("Squeeze", ["x", "axes"], ["s"]), helper.make_node("Reshape", ["s", "shape"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 4, 1, 1])], [helper.make_tensor_value_info("y", F, None)],
        [init("axes", np.array([2, 3], np.int64)), init("shape", np.array([1, 1, 4, 1], np.int64))], opset=13)
    optimized, report = optimize_with(model, ["DropReshapeRoundTrip"])
    assert rewrites(report, "DropReshapeRoundTrip") == 0 and op_types(optimized) == ["Squeeze", "Reshape"]


def _pad_model(pads: list[int], mode: str = "constant") -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pad", ["r", "pads"], ["p"], mode=mode),
         helper.make_node("Relu", ["p"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [init("pads", np.array(pads, np.int64))],
    )


def test_pad_by_zero_is_dropped_in_every_mode() -> None:
    # Swin's window padding once its remainder folds to 0.
    for mode in ("constant", "reflect", "edge"):
        model = _pad_model([0] * 8, mode)
        optimized, report = optimize_with(model, ["DropZeroPad"])
        assert rewrites(report, "DropZeroPad") == 1
        assert op_types(optimized) == ["Relu", "Relu"]
        assert_same_outputs(model, optimized)


def test_pad_by_one_stays() -> None:
    model = _pad_model([0, 0, 0, 0, 0, 1, 1, 0])
    optimized, report = optimize_with(model, ["DropZeroPad"])
    assert rewrites(report, "DropZeroPad") == 0
    assert "not all 0" in report.rules["DropZeroPad"].near_misses[0].reason
    assert op_types(optimized) == ["Relu", "Pad", "Relu"]
    assert_same_outputs(model, optimized)
