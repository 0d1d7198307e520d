"""Golden and negative tests of FuseDecomposedHardSwish (run: pytest examples/writing_rules)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import graphopt

HERE = Path(__file__).parent
RULE = "FuseDecomposedHardSwish"


def decomposed_hard_swish(opset: int = 17, six: float = 6.0) -> onnx.ModelProto:
    """y = x * Clip(x + 3, 0, 6) / 6, as the exporter writes it."""
    consts = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("three", 3.0), ("zero", 0.0), ("six", 6.0), ("div", six))]
    nodes = [
        helper.make_node("Add", ["x", "three"], ["a"]),
        helper.make_node("Clip", ["a", "zero", "six"], ["r"]),
        helper.make_node("Mul", ["x", "r"], ["m"]),
        helper.make_node("Div", ["m", "div"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "hardswish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], consts,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_golden_the_four_ops_become_one_hard_swish() -> None:
    model = decomposed_hard_swish()
    optimized, report = graphopt.optimize(model, patterns=[HERE], enable=[RULE])
    assert report.rules[RULE].applications == 1
    assert [n.op_type for n in optimized.graph.node] == ["HardSwish"]
    x = np.linspace(-5, 5, 16, dtype=np.float32).reshape(2, 8)  # both sides of the -3 and 3 kinks
    np.testing.assert_allclose(run(optimized, x), run(model, x), rtol=1e-6, atol=1e-6)


def test_negative_another_divisor_is_not_hard_swish() -> None:
    optimized, report = graphopt.optimize(decomposed_hard_swish(six=5.0), patterns=[HERE], enable=[RULE])
    assert report.rules[RULE].applications == 0
    assert len(optimized.graph.node) == 4
    assert report.rules[RULE].near_misses[0].reason == "HardSwishConstants: the divisor is 5.0, expected 6"


def test_negative_below_opset_14_there_is_no_hard_swish() -> None:
    optimized, report = graphopt.optimize(decomposed_hard_swish(opset=13), patterns=[HERE], enable=[RULE])
    assert report.rules[RULE].applications == 0
    assert "opset is 13" in report.rules[RULE].near_misses[0].reason
