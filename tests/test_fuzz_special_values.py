"""Differential fuzzing of constant folding over NaN, infinities and -0 (issue 16).

Each example is `y = x + op(c)` (or a cast of it), where `c` is a constant holding a mix
of NaN, +-inf, +-0 and ordinary values and `op` is one op (a reduction, an arg-reduction,
an elementwise op, a clip, a softmax...). graphopt folds `op(c)` where it can; the
optimized model must compute in onnxruntime what the original computes there: NaN in
the same places, equal values elsewhere. onnxruntime's ReduceMax skips NaNs where numpy
propagates them, and its ArgMax picks another index: folding those with numpy was the
bug this family found (the op registry's fact `nan_order_sensitive`).

Profiles as in test_fuzz_differential.py: GRAPHOPT_FUZZ=long for fresh random examples.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import graphopt

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("graphopt-special-ci", max_examples=150, derandomize=True, database=None, **_COMMON)
settings.register_profile("graphopt-special-long", max_examples=int(os.environ.get("GRAPHOPT_FUZZ_EXAMPLES", "3000")), **_COMMON)
FUZZ = settings.get_profile(f"graphopt-special-{os.environ.get('GRAPHOPT_FUZZ', 'ci')}")

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0]
#: op -> (attributes, output is an index)
OPS: dict[str, tuple[dict[str, object], bool]] = {
    "ReduceMax": ({"axes": [1], "keepdims": 1}, False),
    "ReduceMin": ({"axes": [1], "keepdims": 1}, False),
    "ReduceSum": ({"keepdims": 1}, False),
    "ReduceMean": ({"axes": [1], "keepdims": 1}, False),
    "ReduceL2": ({"axes": [1], "keepdims": 1}, False),
    "ReduceLogSumExp": ({"axes": [1], "keepdims": 1}, False),
    "ArgMax": ({"axis": 1, "keepdims": 1}, True),
    "ArgMin": ({"axis": 1, "keepdims": 1}, True),
    "Relu": ({}, False),
    "Abs": ({}, False),
    "Neg": ({}, False),
    "Sqrt": ({}, False),
    "Exp": ({}, False),
    "Log": ({}, False),
    "Reciprocal": ({}, False),
    "Sign": ({}, False),
    "Floor": ({}, False),
    "Round": ({}, False),
    "Sigmoid": ({}, False),
    "Tanh": ({}, False),
    "Erf": ({}, False),
    "Softmax": ({"axis": 1}, False),
    "LeakyRelu": ({"alpha": 0.1}, False),
    "Clip": ({}, False),
    "Max": ({}, False),
    "Min": ({}, False),
    "Mul": ({}, False),
    "Div": ({}, False),
    "Pow": ({}, False),
}


@st.composite
def special_constants(draw: st.DrawFn) -> np.ndarray:
    rows, cols = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    ordinary = st.floats(-8, 8, width=32)
    values = draw(st.lists(st.one_of(st.sampled_from(SPECIAL), ordinary), min_size=rows * cols, max_size=rows * cols))
    return np.array(values, np.float32).reshape(rows, cols)


def _model(op: str, c: np.ndarray, other: np.ndarray) -> onnx.ModelProto:
    attrs, is_index = OPS[op]
    inits = [numpy_helper.from_array(c, "c"), numpy_helper.from_array(other, "d")]
    if op == "Clip":
        inits += [numpy_helper.from_array(other.reshape(-1)[:1].reshape(()), "lo"), numpy_helper.from_array(np.array(2.0, np.float32), "hi")]
        inputs = ["c", "lo", "hi"]
    elif op in ("Max", "Min", "Mul", "Div", "Pow"):
        inputs = ["c", "d"]
    else:
        inputs = ["c"]
    nodes = [helper.make_node(op, inputs, ["r"], **attrs)]
    if is_index:
        nodes.append(helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT))
    nodes.append(helper.make_node("Add", ["x", "rf" if is_index else "r"], ["y"]))
    graph = helper.make_graph(
        nodes, "special", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(c.shape))], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _check(op: str, c: np.ndarray, other: np.ndarray) -> None:
    model = _model(op, c, other)
    x = np.arange(c.size, dtype=np.float32).reshape(c.shape)
    expected = _run(model, x)
    optimized, _ = graphopt.optimize(model, target="onnx")
    actual = _run(optimized, x)
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg=f"{op}: NaN in other places\nc={c.tolist()}")
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6, err_msg=f"{op}: c={c.tolist()} other={other.tolist()}")


@FUZZ
@given(op=st.sampled_from(sorted(OPS)), c=special_constants(), seed=st.integers(0, 2**16))
def test_folding_over_special_values_matches_onnxruntime(op: str, c: np.ndarray, seed: int) -> None:
    rng = np.random.default_rng(seed)
    other = np.where(rng.random(c.shape) < 0.3, rng.choice(np.array(SPECIAL, np.float32), c.shape), rng.standard_normal(c.shape)).astype(np.float32)
    _check(op, c, other)


@pytest.mark.parametrize(
    ("op", "c"),
    [
        ("ReduceMax", [[1, np.nan, 3, 2], [np.nan, 6.5, 1, 0], [np.nan] * 4, [10, 2, np.nan, 9]]),
        ("ReduceMin", [[1, np.nan, 3, 2], [np.nan, 6.5, 1, 0], [np.nan] * 4, [10, 2, np.nan, 9]]),
        ("ArgMax", [[1, np.nan, 3]]),
        ("ArgMin", [[1, np.nan, 3]]),
    ],
)
def test_max_like_reductions_over_nan_are_not_folded_unlike_onnxruntime(op: str, c: list[list[float]]) -> None:
    """The issue's cases: onnxruntime's `x + ReduceMax(c)` is [3, 6.5, nan, 10] where numpy gives [nan, 6.5, nan, nan];
    ArgMax of [1, NaN, 3] is 2 in onnxruntime and 1 in numpy."""
    array = np.array(c, np.float32)
    _check(op, array, np.zeros_like(array))
