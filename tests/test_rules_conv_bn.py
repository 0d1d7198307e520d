"""Golden tests for conv_bn.pdll: BatchNormalization folded into Conv, ConvTranspose, Gemm, MatMul."""

from __future__ import annotations

import numpy as np
import pytest
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, rand, rewrites

F = TensorProto.FLOAT


def bn_inits(c: int, prefix: str = "bn"):
    return [
        init(f"{prefix}_g", rand(c)),
        init(f"{prefix}_b", rand(c)),
        init(f"{prefix}_m", rand(c)),
        init(f"{prefix}_v", rand(c, positive=True)),
    ]


def bn(inp: str, out: str, prefix: str = "bn", **attrs):
    return helper.make_node("BatchNormalization", [inp, f"{prefix}_g", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"], [out], epsilon=1e-3, **attrs)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_conv_bn_folds(with_bias: bool, group: int) -> None:
    cin, cout = 4, 8
    inputs = ["x", "w", "b"] if with_bias else ["x", "w"]
    inits = [init("w", rand(cout, cin // group, 3, 3))] + ([init("b", rand(cout))] if with_bias else []) + bn_inits(cout)
    model = make_model(
        [helper.make_node("Conv", inputs, ["c"], pads=[1, 1, 1, 1], group=group), bn("c", "y")],
        [helper.make_tensor_value_info("x", F, ["N", cin, 6, 6])],
        [helper.make_tensor_value_info("y", F, None)],
        inits,
    )
    optimized, report = optimize_with(model, ["FoldConvBatchNorm"])
    assert rewrites(report, "FoldConvBatchNorm") == 1
    assert op_types(optimized) == ["Conv"]
    conv = optimized.graph.node[0]
    assert {a.name: helper.get_attribute_value(a) for a in conv.attribute}["group"] == group
    assert len(optimized.graph.initializer) == 2  # folded weights and bias; BN's four are gone
    assert_same_outputs(model, optimized)


def test_depthwise_conv_bn_folds() -> None:
    c = 6
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"], group=c), bn("c", "y")],
        [helper.make_tensor_value_info("x", F, [1, c, 5, 5])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(c, 1, 3, 3))] + bn_inits(c),
    )
    optimized, report = optimize_with(model, ["FoldConvBatchNorm"])
    assert rewrites(report, "FoldConvBatchNorm") == 1
    assert op_types(optimized) == ["Conv"]
    assert_same_outputs(model, optimized)


def test_conv_bn_with_second_user_does_not_fold() -> None:
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"]), bn("c", "y"), helper.make_node("Relu", ["c"], ["r"])],
        [helper.make_tensor_value_info("x", F, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("r", F, None)],
        [init("w", rand(8, 4, 3, 3))] + bn_inits(8),
    )
    optimized, report = optimize_with(model, ["FoldConvBatchNorm"])
    assert rewrites(report, "FoldConvBatchNorm") == 0
    assert sorted(op_types(optimized)) == ["BatchNormalization", "Conv", "Relu"]
    miss = report.rules["FoldConvBatchNorm"].near_misses[0]
    assert "another user" in miss.reason


def test_conv_output_as_graph_output_does_not_fold() -> None:
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"]), bn("c", "y")],
        [helper.make_tensor_value_info("x", F, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("c", F, None)],
        [init("w", rand(8, 4, 3, 3))] + bn_inits(8),
    )
    optimized, report = optimize_with(model, ["FoldConvBatchNorm"])
    assert rewrites(report, "FoldConvBatchNorm") == 0
    assert "graph output" in report.rules["FoldConvBatchNorm"].near_misses[0].reason


def test_training_mode_bn_does_not_fold() -> None:
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"]), bn("c", "y", training_mode=1)],
        [helper.make_tensor_value_info("x", F, [2, 4, 5, 5])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(8, 4, 3, 3))] + bn_inits(8),
        opset=15,
    )
    optimized, report = optimize_with(model, ["FoldConvBatchNorm"])
    assert rewrites(report, "FoldConvBatchNorm") == 0
    assert "training_mode" in report.rules["FoldConvBatchNorm"].near_misses[0].reason


def test_weights_from_graph_input_do_not_fold() -> None:
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"]), bn("c", "y")],
        [helper.make_tensor_value_info("x", F, [1, 4, 5, 5]), helper.make_tensor_value_info("w", F, [8, 4, 3, 3])],
        [helper.make_tensor_value_info("y", F, None)],
        bn_inits(8),
    )
    optimized, report = optimize_with(model, ["FoldConvBatchNorm"])
    assert rewrites(report, "FoldConvBatchNorm") == 0
    assert "not a constant" in report.rules["FoldConvBatchNorm"].near_misses[0].reason


def test_initializer_that_is_also_an_input_does_not_fold() -> None:
    # An initializer listed among the inputs can be overridden at run time: not a constant.
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"]), bn("c", "y")],
        [helper.make_tensor_value_info("x", F, [1, 4, 5, 5]), helper.make_tensor_value_info("w", F, [8, 4, 3, 3])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(8, 4, 3, 3))] + bn_inits(8),
    )
    _, report = optimize_with(model, ["FoldConvBatchNorm"])
    assert rewrites(report, "FoldConvBatchNorm") == 0


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_bn_folds(group: int) -> None:
    cin, cout = 4, 6
    model = make_model(
        [helper.make_node("ConvTranspose", ["x", "w", "b"], ["c"], group=group, strides=[2, 2]), bn("c", "y")],
        [helper.make_tensor_value_info("x", F, [1, cin, 4, 4])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(cin, cout // group, 3, 3)), init("b", rand(cout))] + bn_inits(cout),
    )
    optimized, report = optimize_with(model, ["FoldConvBatchNorm"])
    assert rewrites(report, "FoldConvBatchNorm") == 1
    assert op_types(optimized) == ["ConvTranspose"]
    assert_same_outputs(model, optimized)


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("with_c", [True, False])
def test_gemm_bn_folds_respecting_alpha_beta(trans_b: int, with_c: bool) -> None:
    k, n = 5, 7
    inputs = ["a", "B", "C"] if with_c else ["a", "B"]
    inits = [init("B", rand(n, k) if trans_b else rand(k, n))] + ([init("C", rand(n))] if with_c else []) + bn_inits(n)
    model = make_model(
        [helper.make_node("Gemm", inputs, ["g"], transB=trans_b, alpha=0.5, beta=2.0), bn("g", "y")],
        [helper.make_tensor_value_info("a", F, [3, k])],
        [helper.make_tensor_value_info("y", F, None)],
        inits,
    )
    optimized, report = optimize_with(model, ["FoldGemmBatchNorm"])
    assert rewrites(report, "FoldGemmBatchNorm") == 1
    assert op_types(optimized) == ["Gemm"]
    assert_same_outputs(model, optimized)


def test_matmul_bn_folds_into_gemm() -> None:
    model = make_model(
        [helper.make_node("MatMul", ["a", "B"], ["m"]), bn("m", "y")],
        [helper.make_tensor_value_info("a", F, [3, 5])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("B", rand(5, 7))] + bn_inits(7),
    )
    optimized, report = optimize_with(model, ["FoldMatMulBatchNorm"])
    assert rewrites(report, "FoldMatMulBatchNorm") == 1
    assert op_types(optimized) == ["Gemm"]
    assert_same_outputs(model, optimized)


def test_3d_matmul_bn_does_not_fold() -> None:
    # BN's channel axis is 1; for a 3-D MatMul output that is not the feature axis.
    model = make_model(
        [helper.make_node("MatMul", ["a", "B"], ["m"]), bn("m", "y")],
        [helper.make_tensor_value_info("a", F, [2, 7, 5])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("B", rand(5, 7))] + bn_inits(7),
    )
    optimized, report = optimize_with(model, ["FoldMatMulBatchNorm"])
    assert rewrites(report, "FoldMatMulBatchNorm") == 0
    assert sorted(op_types(optimized)) == ["BatchNormalization", "MatMul"]
    assert np.isfinite(report.rules["FoldMatMulBatchNorm"].attempts)
