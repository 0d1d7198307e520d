"""Golden tests for bias_fold.pdll (a separate bias Add folded into Conv / ConvTranspose) and its
interplay with conv_bn.pdll: ConvTranspose -> bias Add -> BatchNormalization becomes one ConvTranspose."""

from __future__ import annotations

import numpy as np
import pytest
from rule_testing import (
    FUSED_CONV_WINS,
    TensorProto,
    assert_same_outputs,
    helper,
    init,
    make_model,
    op_types,
    optimize_with,
    rand,
    rewrites,
)

F = TensorProto.FLOAT
RULES = ["FoldAddIntoConvBias", "FoldAddIntoConvBiasBeforeRelu", "FoldChannelsLastAddIntoConvBias"]


def bn_inits(c: int):
    return [init("bn_g", rand(c)), init("bn_b", rand(c)), init("bn_m", rand(c)), init("bn_v", rand(c, positive=True))]


@pytest.mark.parametrize("bias_shape", [(1, 8, 1, 1), (8, 1, 1), (1,)])
@pytest.mark.parametrize("with_own_bias", [False, True])
def test_conv_bias_add_folds(bias_shape, with_own_bias: bool) -> None:
    inputs = ["x", "w", "b"] if with_own_bias else ["x", "w"]
    inits = [init("w", rand(8, 4, 3, 3)), init("c", rand(*bias_shape))] + ([init("b", rand(8))] if with_own_bias else [])
    model = make_model([helper.make_node("Conv", inputs, ["conv"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["c", "conv"], ["y"])],
                       [helper.make_tensor_value_info("x", F, [2, 4, 6, 6])], [helper.make_tensor_value_info("y", F, None)], inits)
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "FoldAddIntoConvBias") == 1
    assert op_types(optimized) == ["Conv"] and len(optimized.graph.node[0].input) == 3
    assert_same_outputs(model, optimized)


def test_add_of_a_full_tensor_does_not_fold() -> None:
    """[1, 8, 6, 6] varies over space: not a bias."""
    model = make_model([helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["conv", "c"], ["y"])],
                       [helper.make_tensor_value_info("x", F, [2, 4, 6, 6])], [helper.make_tensor_value_info("y", F, None)],
                       [init("w", rand(8, 4, 3, 3)), init("c", rand(1, 8, 6, 6))])
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "FoldAddIntoConvBias") == 0
    assert "not per channel" in report.rules["FoldAddIntoConvBias"].near_misses[0].reason
    assert op_types(optimized) == ["Conv", "Add"]


def test_conv_used_twice_does_not_fold() -> None:
    model = make_model([helper.make_node("Conv", ["x", "w"], ["conv"]), helper.make_node("Add", ["conv", "c"], ["y"]),
                        helper.make_node("Relu", ["conv"], ["r"])],
                       [helper.make_tensor_value_info("x", F, [1, 4, 5, 5])],
                       [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("r", F, None)],
                       [init("w", rand(8, 4, 3, 3)), init("c", rand(1, 8, 1, 1))])
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "FoldAddIntoConvBias") == 0 and len(optimized.graph.node) == 3


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_bias_add_then_bn_folds_into_one_op(group: int) -> None:
    """The paddle2onnx form issue 14 found unfolded: ConvTranspose, Add(bias), BatchNormalization."""
    cin, cout = 4, 6
    model = make_model(
        [helper.make_node("ConvTranspose", ["x", "w"], ["ct"], kernel_shape=[2, 2], strides=[2, 2], group=group),
         helper.make_node("Add", ["ct", "c"], ["a"]),
         helper.make_node("BatchNormalization", ["a", "bn_g", "bn_b", "bn_m", "bn_v"], ["y"], epsilon=1e-3)],
        [helper.make_tensor_value_info("x", F, [1, cin, 5, 5])], [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(cin, cout // group, 2, 2)), init("c", rand(1, cout, 1, 1))] + bn_inits(cout),
    )
    optimized, report = optimize_with(model, RULES + ["FoldConvBatchNorm"])
    assert rewrites(report, "FoldAddIntoConvBias") == 1
    assert rewrites(report, "FoldConvBatchNorm") == 1
    assert op_types(optimized) == ["ConvTranspose"]
    assert_same_outputs(model, optimized)


def test_conv_bias_add_then_bn_folds_into_one_conv() -> None:
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["conv"]), helper.make_node("Add", ["conv", "c"], ["a"]),
         helper.make_node("BatchNormalization", ["a", "bn_g", "bn_b", "bn_m", "bn_v"], ["y"], epsilon=1e-3)],
        [helper.make_tensor_value_info("x", F, [1, 4, 5, 5])], [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(8, 4, 3, 3)), init("c", rand(8, 1, 1))] + bn_inits(8),
    )
    optimized, report = optimize_with(model, RULES + ["FoldConvBatchNorm"])
    assert rewrites(report, "FoldAddIntoConvBias") == 1 and rewrites(report, "FoldConvBatchNorm") == 1
    assert op_types(optimized) == ["Conv"]
    assert_same_outputs(model, optimized)


@pytest.mark.parametrize("bias_shape", [(8,), (1, 1, 1, 8)])
def test_channels_last_bias_add_folds_through_the_transpose(bias_shape) -> None:
    """tf2onnx: Transpose to NCHW, Conv, Transpose back to NHWC, Add of a [C] bias."""
    model = make_model(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]), helper.make_node("Conv", ["t", "w"], ["conv"], pads=[1, 1, 1, 1]),
         helper.make_node("Transpose", ["conv"], ["back"], perm=[0, 2, 3, 1]), helper.make_node("Add", ["back", "c"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 6, 6, 4])], [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(8, 4, 3, 3)), init("c", rand(*bias_shape))],
    )
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "FoldChannelsLastAddIntoConvBias") == 1
    assert op_types(optimized) == ["Transpose", "Conv", "Transpose"]
    assert_same_outputs(model, optimized)


def test_bias_on_a_spatial_axis_after_transpose_does_not_fold() -> None:
    """perm [0, 2, 1, 3] leaves W last, not the channels: a [W] constant is not a bias."""
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]), helper.make_node("Transpose", ["conv"], ["back"], perm=[0, 2, 1, 3]),
         helper.make_node("Add", ["back", "c"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 4, 8, 8])], [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(8, 4, 3, 3)), init("c", rand(8))],
    )
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "FoldChannelsLastAddIntoConvBias") == 0
    assert op_types(optimized) == ["Conv", "Transpose", "Add"]


def test_int_bias_does_not_fold() -> None:
    model = make_model([helper.make_node("Conv", ["x", "w"], ["conv"]), helper.make_node("Cast", ["conv"], ["ci"], to=TensorProto.INT64),
                        helper.make_node("Add", ["ci", "c"], ["y"])],
                       [helper.make_tensor_value_info("x", F, [1, 4, 5, 5])], [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
                       [init("w", rand(8, 4, 3, 3)), init("c", np.ones((1, 8, 1, 1), np.int64))])
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "FoldAddIntoConvBias") == 0 and len(optimized.graph.node) == 3


@pytest.mark.parametrize("with_relu", [False, True])
def test_squeeze_excite_bias_stays_a_bias_on_ort_cpu(with_relu: bool) -> None:
    """A 1x1 Conv of a pooled [1, C, 1, 1] tensor plus its [1, C, 1, 1] bias: the bias goes into the
    Conv (then FusedConv's activation), not into FusedConv's residual input Z."""
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Conv", ["p", "w"], ["conv"]),
             helper.make_node("Add", ["conv", "c"], ["a" if with_relu else "y"])]
    if with_relu:
        nodes.append(helper.make_node("Relu", ["a"], ["y"]))
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [1, 8, 5, 5])], [helper.make_tensor_value_info("y", F, None)],
                       [init("w", rand(4, 8, 1, 1)), init("c", rand(1, 4, 1, 1))])
    optimized, report = optimize_with(model, None, target="ort-cpu", cost_table=FUSED_CONV_WINS)  # FusedConv kept: its inputs are checked
    assert rewrites(report, "FoldAddIntoConvBiasBeforeRelu" if with_relu else "FoldAddIntoConvBias") == 1
    assert rewrites(report, "FuseConvAddRelu") == 0 and rewrites(report, "FuseConvAdd") == 0
    conv = optimized.graph.node[-1]
    assert len([i for i in conv.input if i]) == 3   # x, w, b: no Z
    assert_same_outputs(model, optimized)
