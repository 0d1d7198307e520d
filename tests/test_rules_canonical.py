"""Golden tests for canonical.pdll."""

from __future__ import annotations

import numpy as np
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, rewrites


def test_range_of_one_element_vectors_gets_scalar_inputs() -> None:
    model = make_model(
        [helper.make_node("Range", ["start", "limit", "delta"], ["y"])],
        [helper.make_tensor_value_info("limit", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        [init("start", np.array(0, np.int64)), init("delta", np.array([2], np.int64))],
    )
    optimized, report = optimize_with(model, ["RangeOfScalars"])
    assert rewrites(report, "RangeOfScalars") == 1
    assert op_types(optimized) == ["Reshape", "Range"]  # the constants' Reshapes fold away
    feeds_model = optimized
    import onnxruntime as ort

    got = ort.InferenceSession(feeds_model.SerializeToString()).run(None, {"limit": np.array([7], np.int64)})[0]
    np.testing.assert_array_equal(got, [0, 2, 4, 6])


def test_range_of_scalars_is_left_alone() -> None:
    model = make_model(
        [helper.make_node("Range", ["start", "limit", "delta"], ["y"])],
        [helper.make_tensor_value_info("limit", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [init("start", np.array(0, np.float32)), init("delta", np.array(1.5, np.float32))],
    )
    optimized, report = optimize_with(model, ["RangeOfScalars"])
    assert rewrites(report, "RangeOfScalars") == 0
    assert op_types(optimized) == ["Range"]
    assert_same_outputs(model, optimized, shapes={"limit": ()})
