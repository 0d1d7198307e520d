"""Golden tests for shape_folding.pdll: Shape, Size and Gather-of-Shape of known dims become constants."""

from __future__ import annotations

import numpy as np
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, rewrites

F = TensorProto.FLOAT
SHAPE_RULES = ["FoldStaticShape", "FoldGatherOfStaticDims"]


def test_shape_of_static_value_folds_and_reshape_target_becomes_constant() -> None:
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Shape", ["r"], ["s"]),
            helper.make_node("Reshape", ["r", "s"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", F, [2, 3, 4])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    optimized, report = optimize_with(model, SHAPE_RULES)
    assert rewrites(report, "FoldStaticShape") == 1
    assert op_types(optimized) == ["Relu", "Reshape"]
    assert_same_outputs(model, optimized)


def test_shape_with_symbolic_dim_does_not_fold_but_static_gather_does() -> None:
    # Reshape x[N, 3, 4] to [N, 12]: the 3 and 4 are static, N is not.
    model = make_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
            helper.make_node("Gather", ["s", "i12"], ["d"], axis=0),
            helper.make_node("ReduceProd", ["d"], ["p"], keepdims=1),
            helper.make_node("Concat", ["n", "p"], ["target"], axis=0),
            helper.make_node("Reshape", ["x", "target"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", F, ["N", 3, 4])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("i0", np.array([0], np.int64)), init("i12", np.array([1, 2], np.int64))],
    )
    optimized, report = optimize_with(model, SHAPE_RULES)
    assert rewrites(report, "FoldStaticShape") == 0
    assert "not static" in report.rules["FoldStaticShape"].near_misses[0].reason
    assert rewrites(report, "FoldGatherOfStaticDims") == 1
    # Gather of [3, 4] and its ReduceProd fold away; N stays symbolic.
    assert op_types(optimized) == ["Shape", "Gather", "Concat", "Reshape"]
    assert_same_outputs(model, optimized, shapes={"x": (5, 3, 4)})


def test_size_of_static_value_folds() -> None:
    model = make_model(
        [helper.make_node("Size", ["x"], ["n"]), helper.make_node("Cast", ["n"], ["y"], to=F)],
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    optimized, report = optimize_with(model, SHAPE_RULES)
    assert rewrites(report, "FoldStaticShape") == 1
    assert_same_outputs(model, optimized)
    assert "Size" not in op_types(optimized)


def test_size_of_a_value_with_a_symbolic_dim_does_not_fold() -> None:
    model = make_model(
        [helper.make_node("Size", ["x"], ["n"]), helper.make_node("Cast", ["n"], ["y"], to=F)],
        [helper.make_tensor_value_info("x", F, ["batch", 3])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    optimized, report = optimize_with(model, SHAPE_RULES)
    assert rewrites(report, "FoldStaticShape") == 0
    assert "Size" in op_types(optimized)
    assert "not static" in report.rules["FoldStaticShape"].near_misses[0].reason
