"""Golden tests for conv_activation.pdll, and the capability table that gates it per target."""

from __future__ import annotations

import pytest
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, rand, rewrites


def conv_relu(dtype=TensorProto.FLOAT):
    import numpy as np

    np_dtype = np.float32 if dtype == TensorProto.FLOAT else np.float16
    return make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        [helper.make_tensor_value_info("x", dtype, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", dtype, None)],
        [init("w", rand(4, 3, 3, 3).astype(np_dtype)), init("b", rand(4).astype(np_dtype))],
    )


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_conv_relu_fuses_on_onnxruntime_targets(target: str) -> None:
    model = conv_relu()
    optimized, report = optimize_with(model, ["FuseConvRelu"], target=target)
    assert rewrites(report, "FuseConvRelu") == 1
    assert [(n.domain, n.op_type) for n in optimized.graph.node] == [("com.microsoft", "FusedConv")]
    if target == "ort-cpu":
        assert_same_outputs(model, optimized)


def test_conv_relu_is_not_fused_for_plain_onnx() -> None:
    model = conv_relu()
    optimized, report = optimize_with(model, ["FuseConvRelu"], target="onnx")
    assert rewrites(report, "FuseConvRelu") == 0
    assert op_types(optimized) == ["Conv", "Relu"]
    assert "no lowering" in report.rules["FuseConvRelu"].near_misses[0].reason


def test_conv_relu_in_f16_is_not_fused_where_the_kernel_is_f32_only() -> None:
    model = conv_relu(TensorProto.FLOAT16)
    optimized, report = optimize_with(model, ["FuseConvRelu"], target="ort-cpu")
    assert rewrites(report, "FuseConvRelu") == 0
    assert op_types(optimized) == ["Conv", "Relu"]
