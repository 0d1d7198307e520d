"""Golden tests for matmul_bias.pdll: MatMul + Add -> Gemm."""

from __future__ import annotations

import pytest
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, rand, rewrites

F = TensorProto.FLOAT


@pytest.mark.parametrize("bias_shape", [(7,), (1, 7), (3, 7), (3, 1), (1,)])
@pytest.mark.parametrize("bias_first", [False, True])
def test_matmul_add_becomes_gemm(bias_shape, bias_first) -> None:
    add_inputs = ["c", "m"] if bias_first else ["m", "c"]
    model = make_model(
        [helper.make_node("MatMul", ["a", "B"], ["m"]), helper.make_node("Add", add_inputs, ["y"])],
        [helper.make_tensor_value_info("a", F, [3, 5])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("B", rand(5, 7)), init("c", rand(*bias_shape))],
    )
    optimized, report = optimize_with(model, ["MatMulAddToGemm"])
    assert rewrites(report, "MatMulAddToGemm") == 1
    assert op_types(optimized) == ["Gemm"]
    assert_same_outputs(model, optimized)


def test_symbolic_rows_with_vector_bias() -> None:
    model = make_model(
        [helper.make_node("MatMul", ["a", "B"], ["m"]), helper.make_node("Add", ["m", "c"], ["y"])],
        [helper.make_tensor_value_info("a", F, ["M", 5])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("B", rand(5, 7)), init("c", rand(7))],
    )
    optimized, report = optimize_with(model, ["MatMulAddToGemm"])
    assert rewrites(report, "MatMulAddToGemm") == 1
    assert_same_outputs(model, optimized, shapes={"a": (4, 5)})


def test_3d_matmul_is_not_fused() -> None:
    model = make_model(
        [helper.make_node("MatMul", ["a", "B"], ["m"]), helper.make_node("Add", ["m", "c"], ["y"])],
        [helper.make_tensor_value_info("a", F, [2, 3, 5])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("B", rand(5, 7)), init("c", rand(7))],
    )
    optimized, report = optimize_with(model, ["MatMulAddToGemm"])
    assert rewrites(report, "MatMulAddToGemm") == 0
    assert "rank 3" in report.rules["MatMulAddToGemm"].near_misses[0].reason


def test_bias_that_grows_the_result_is_not_fused() -> None:
    model = make_model(
        [helper.make_node("MatMul", ["a", "B"], ["m"]), helper.make_node("Add", ["m", "c"], ["y"])],
        [helper.make_tensor_value_info("a", F, [1, 5])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("B", rand(5, 7)), init("c", rand(4, 7))],  # broadcasts [1,7] up to [4,7]
    )
    optimized, report = optimize_with(model, ["MatMulAddToGemm"])
    assert rewrites(report, "MatMulAddToGemm") == 0
    assert_same_outputs(model, optimized)


def test_matmul_with_second_user_is_not_fused() -> None:
    model = make_model(
        [helper.make_node("MatMul", ["a", "B"], ["m"]), helper.make_node("Add", ["m", "c"], ["y"]), helper.make_node("Relu", ["m"], ["r"])],
        [helper.make_tensor_value_info("a", F, [3, 5])],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("r", F, None)],
        [init("B", rand(5, 7)), init("c", rand(7))],
    )
    _, report = optimize_with(model, ["MatMulAddToGemm"])
    assert rewrites(report, "MatMulAddToGemm") == 0


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_add_keeps_alpha_and_transposes(trans_a: int, trans_b: int) -> None:
    a_shape = (5, 3) if trans_a else (3, 5)
    b = rand(7, 5) if trans_b else rand(5, 7)
    model = make_model(
        [helper.make_node("Gemm", ["a", "B"], ["g"], alpha=0.25, beta=3.0, transA=trans_a, transB=trans_b), helper.make_node("Add", ["g", "c"], ["y"])],
        [helper.make_tensor_value_info("a", F, list(a_shape))],
        [helper.make_tensor_value_info("y", F, None)],
        [init("B", b), init("c", rand(7))],
    )
    optimized, report = optimize_with(model, ["GemmAddToGemm"])
    assert rewrites(report, "GemmAddToGemm") == 1
    assert op_types(optimized) == ["Gemm"]
    assert_same_outputs(model, optimized)


def test_gemm_with_c_is_not_refused_silently() -> None:
    # A Gemm that already has C has 3 inputs: the rule (2 inputs) must not fire.
    model = make_model(
        [helper.make_node("Gemm", ["a", "B", "c0"], ["g"]), helper.make_node("Add", ["g", "c"], ["y"])],
        [helper.make_tensor_value_info("a", F, [3, 5])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("B", rand(5, 7)), init("c0", rand(7)), init("c", rand(7))],
    )
    _, report = optimize_with(model, ["GemmAddToGemm"])
    assert rewrites(report, "GemmAddToGemm") == 0
    assert "3 inputs" in report.rules["GemmAddToGemm"].near_misses[0].reason
