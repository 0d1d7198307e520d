"""Golden tests for linear_affine.pdll: a per-channel scale (BatchNormalization written out as
Mul + Add) folded into Conv / ConvTranspose / MatMul weights, the shift then into the bias."""

from __future__ import annotations

import pytest
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, rand, rewrites

F = TensorProto.FLOAT
RULES = ["FoldScaleIntoConv", "FoldScaleIntoMatMul", "FoldAddIntoConvBias",
         "MatMulAddToGemm"]


@pytest.mark.parametrize("scale_shape", [(1, 8, 1, 1), (8, 1, 1), (1,)])
@pytest.mark.parametrize("group", [1, 2])
def test_conv_mul_add_becomes_one_conv(scale_shape, group: int) -> None:
    """tf2onnx's written-out BatchNormalization after a Conv: Mul(scale), Add(shift)."""
    model = make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=group), helper.make_node("Mul", ["c", "s"], ["m"]),
         helper.make_node("Add", ["m", "t"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 4, 6, 6])], [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(8, 4 // group, 3, 3)), init("b", rand(8)), init("s", rand(*scale_shape)), init("t", rand(1, 8, 1, 1))])
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "FoldScaleIntoConv") == 1 and rewrites(report, "FoldAddIntoConvBias") == 1
    assert op_types(optimized) == ["Conv"]
    assert_same_outputs(model, optimized)


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_scale_folds(group: int) -> None:
    model = make_model(
        [helper.make_node("ConvTranspose", ["x", "w"], ["c"], kernel_shape=[2, 2], strides=[2, 2], group=group),
         helper.make_node("Mul", ["s", "c"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 4, 3, 3])], [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(4, 6 // group, 2, 2)), init("s", rand(6, 1, 1))])
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "FoldScaleIntoConv") == 1
    assert op_types(optimized) == ["ConvTranspose"]
    assert_same_outputs(model, optimized)


def test_matmul_column_scale_folds() -> None:
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Mul", ["mm", "s"], ["y"])],
        [helper.make_tensor_value_info("x", F, [2, 5, 4])], [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(4, 6)), init("s", rand(6))])
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "FoldScaleIntoMatMul") == 1
    assert op_types(optimized) == ["MatMul"]
    assert_same_outputs(model, optimized)


def test_scale_that_varies_over_space_does_not_fold() -> None:
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Mul", ["c", "s"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 4, 5, 5])], [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(8, 4, 1, 1)), init("s", rand(1, 1, 5, 5))])
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "FoldScaleIntoConv") == 0
    assert "not one value per channel" in report.rules["FoldScaleIntoConv"].near_misses[0].reason
    assert op_types(optimized) == ["Conv", "Mul"]


def test_matmul_row_scale_does_not_fold() -> None:
    """[5, 1] scales the rows of the product (the tokens), not the weights' columns."""
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Mul", ["mm", "s"], ["y"])],
        [helper.make_tensor_value_info("x", F, [2, 5, 4])], [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(4, 6)), init("s", rand(5, 1))])
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "FoldScaleIntoMatMul") == 0 and op_types(optimized) == ["MatMul", "Mul"]


def test_conv_with_computed_weights_does_not_fold() -> None:
    model = make_model(
        [helper.make_node("Conv", ["x", "wi"], ["c"]), helper.make_node("Mul", ["c", "s"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 4, 5, 5]), helper.make_tensor_value_info("wi", F, [8, 4, 1, 1])],
        [helper.make_tensor_value_info("y", F, None)], [init("s", rand(8, 1, 1))])
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "FoldScaleIntoConv") == 0 and op_types(optimized) == ["Conv", "Mul"]
    assert_same_outputs(model, optimized, feeds={"x": rand(1, 4, 5, 5), "wi": rand(8, 4, 1, 1)})
