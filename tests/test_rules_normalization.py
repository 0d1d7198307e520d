"""Golden tests for normalization.pdll: decomposed LayerNorm -> LayerNormalization, Add + LayerNormalization -> SkipLayerNorm."""

from __future__ import annotations

import functools
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from rule_testing import SKIP_NORM_WINS, TensorProto, assert_same_outputs, helper, init, make_model, op_types, rand, rewrites
from rule_testing import optimize_with as _optimize_with

import graphopt
from graphopt.verify import verify

# On ort-cpu a fused residual norm is a decision (graphopt/passes/skip_norm.py) that the measured
# table mostly answers 'unfused'; these tests check the rules' output, so they optimize with a table
# in which the fused op wins (tests/test_skip_norm_decision.py checks the decision).
optimize_with = functools.partial(_optimize_with, cost_table=SKIP_NORM_WINS)

F = TensorProto.FLOAT
H = 8


def decomposed_layer_norm(
    opset: int = 17,
    square: str = "pow",
    axes: int = -1,
    eps_const: bool = True,
    sub_escapes: bool = False,
    axes_as_input: bool | None = None,
) -> onnx.ModelProto:
    """x [2, 4, H] -> mean / var over `axes` -> normalize -> * gamma + beta, as exporters write it."""
    as_input = opset >= 18 if axes_as_input is None else axes_as_input
    inits = [init("gamma", rand(H)), init("beta", rand(H))]
    if eps_const:
        inits.append(init("eps", np.array(1e-5, np.float32)))
    if square == "pow":
        inits.append(init("two", np.array(2.0, np.float32)))
    if as_input:
        inits.append(init("axes", np.array([axes], np.int64)))

    def reduce_mean(inp: str, out: str) -> onnx.NodeProto:
        if as_input:
            return helper.make_node("ReduceMean", [inp, "axes"], [out], keepdims=1)
        return helper.make_node("ReduceMean", [inp], [out], axes=[axes], keepdims=1)

    nodes = [
        reduce_mean("x", "mean"),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["sq"]) if square == "pow" else helper.make_node("Mul", ["d", "d"], ["sq"]),
        reduce_mean("sq", "var"),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["std"]),
        helper.make_node("Div", ["d", "std"], ["norm"]),
        helper.make_node("Mul", ["norm", "gamma"], ["scaled"]),
        helper.make_node("Add", ["scaled", "beta"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("x", F, ["N", 4, H])]
    if not eps_const:
        inputs.append(helper.make_tensor_value_info("eps", F, []))
    outputs = [helper.make_tensor_value_info("y", F, None)]
    if sub_escapes:
        outputs.append(helper.make_tensor_value_info("d", F, None))
    return make_model(nodes, inputs, outputs, inits, opset=opset)


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("opset", [17, 18])
def test_decomposed_layer_norm_fuses(target: str, square: str, opset: int) -> None:
    model = decomposed_layer_norm(opset=opset, square=square)
    optimized, report = optimize_with(model, ["FuseLayerNorm"], target=target)
    assert rewrites(report, "FuseLayerNorm") == 1
    assert op_types(optimized) == ["LayerNormalization"]
    attrs = {a.name: helper.get_attribute_value(a) for a in optimized.graph.node[0].attribute}
    assert attrs["axis"] == -1
    assert attrs["epsilon"] == pytest.approx(1e-5)
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-5)


def test_decomposed_layer_norm_with_positive_last_axis_fuses() -> None:
    model = decomposed_layer_norm(axes=2)
    optimized, report = optimize_with(model, ["FuseLayerNorm"], target="onnx")
    assert rewrites(report, "FuseLayerNorm") == 1
    assert_same_outputs(model, optimized)


def test_decomposed_layer_norm_on_ort_cuda_emits_layer_normalization() -> None:
    optimized, report = optimize_with(decomposed_layer_norm(), ["FuseLayerNorm"], target="ort-cuda")
    assert rewrites(report, "FuseLayerNorm") == 1
    assert [(n.domain, n.op_type) for n in optimized.graph.node] == [("", "LayerNormalization")]


def test_layer_norm_below_opset_17_does_not_fuse_for_plain_onnx() -> None:
    model = decomposed_layer_norm(opset=16)
    optimized, report = optimize_with(model, ["FuseLayerNorm"], target="onnx")
    assert rewrites(report, "FuseLayerNorm") == 0
    assert len(optimized.graph.node) == 9
    assert "opset is 16" in report.rules["FuseLayerNorm"].near_misses[0].reason


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
@pytest.mark.parametrize("opset", [11, 13, 16])
def test_layer_norm_below_opset_17_becomes_onnxruntimes_layer_normalization(target: str, opset: int) -> None:
    # onnxruntime registers LayerNormalization in the default domain from opset 1 (graphopt.LayerNorm's lowering).
    model = decomposed_layer_norm(opset=opset)
    optimized, report = optimize_with(model, ["FuseLayerNorm"], target=target)
    assert rewrites(report, "FuseLayerNorm") == 1
    assert [(n.domain, n.op_type) for n in optimized.graph.node] == [("", "LayerNormalization")]
    assert optimized.opset_import[0].version == opset
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-5)


def test_layer_norm_with_non_constant_eps_does_not_fuse() -> None:
    model = decomposed_layer_norm(eps_const=False)
    optimized, report = optimize_with(model, ["FuseLayerNorm"], target="ort-cpu")
    assert rewrites(report, "FuseLayerNorm") == 0
    assert len(optimized.graph.node) == 9


def test_layer_norm_over_another_axis_does_not_fuse() -> None:
    model = decomposed_layer_norm(axes=1)
    optimized, report = optimize_with(model, ["FuseLayerNorm"], target="ort-cpu")
    assert rewrites(report, "FuseLayerNorm") == 0
    assert len(optimized.graph.node) == 9
    assert "not only the last one" in report.rules["FuseLayerNorm"].near_misses[0].reason


def test_layer_norm_whose_sub_has_another_user_does_not_fuse() -> None:
    model = decomposed_layer_norm(sub_escapes=True)
    optimized, report = optimize_with(model, ["FuseLayerNorm"], target="ort-cpu")
    assert rewrites(report, "FuseLayerNorm") == 0
    assert len(optimized.graph.node) == 9
    assert "graph output" in report.rules["FuseLayerNorm"].near_misses[0].reason


# --------------------------------------------------------------------------- SkipLayerNorm


def add_layer_norm(add_escapes: bool = False, with_beta: bool = True, skip_shape: tuple | None = None) -> onnx.ModelProto:
    ln_inputs = ["s", "gamma", "beta"] if with_beta else ["s", "gamma"]
    outputs = [helper.make_tensor_value_info("y", F, None)]
    if add_escapes:
        outputs.append(helper.make_tensor_value_info("s", F, None))
    return make_model(
        [
            helper.make_node("Add", ["a", "b"], ["s"]),
            helper.make_node("LayerNormalization", ln_inputs, ["y"], axis=-1, epsilon=1e-6),
        ],
        [helper.make_tensor_value_info("a", F, ["N", 4, H]), helper.make_tensor_value_info("b", F, skip_shape or ["N", 4, H])],
        outputs,
        [init("gamma", rand(H)), init("beta", rand(H))],
    )


@pytest.mark.parametrize("with_beta", [True, False])
def test_add_layer_norm_fuses_on_ort_cpu(with_beta: bool) -> None:
    model = add_layer_norm(with_beta=with_beta)
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu")
    assert rewrites(report, "FuseSkipLayerNorm") == 1
    assert [(n.domain, n.op_type) for n in optimized.graph.node] == [("com.microsoft", "SkipLayerNormalization")]
    attrs = {a.name: helper.get_attribute_value(a) for a in optimized.graph.node[0].attribute}
    assert attrs["epsilon"] == pytest.approx(1e-6)
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-5)


def test_add_layer_norm_on_ort_cuda_emits_skip_layer_normalization() -> None:
    optimized, report = optimize_with(add_layer_norm(), ["FuseSkipLayerNorm"], target="ort-cuda")
    assert rewrites(report, "FuseSkipLayerNorm") == 1
    assert [(n.domain, n.op_type) for n in optimized.graph.node] == [("com.microsoft", "SkipLayerNormalization")]


def test_add_layer_norm_is_not_fused_for_plain_onnx() -> None:
    model = add_layer_norm()
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="onnx")
    assert rewrites(report, "FuseSkipLayerNorm") == 0
    assert op_types(optimized) == ["Add", "LayerNormalization"]
    assert "no lowering" in report.rules["FuseSkipLayerNorm"].near_misses[0].reason


def test_sum_that_is_a_graph_output_comes_from_the_fourth_output() -> None:
    model = add_layer_norm(add_escapes=True)
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu")
    assert rewrites(report, "FuseSkipLayerNorm") == 1
    assert op_types(optimized) == ["SkipLayerNormalization"]
    assert optimized.graph.node[0].output[3] == "s"  # the graph output keeps its name
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-5)


def test_add_used_elsewhere_fuses_keeping_the_sum() -> None:
    # Pre-LN residual streams: the sum also feeds the next block. SkipLayerNormalization's
    # fourth output is that sum, so the Add goes anyway.
    model = add_layer_norm(add_escapes=True)
    model.graph.node.append(helper.make_node("Relu", ["s"], ["r"]))
    model.graph.output.append(helper.make_tensor_value_info("r", F, None))
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu")
    assert rewrites(report, "FuseSkipLayerNorm") == 1
    assert op_types(optimized) == ["SkipLayerNormalization", "Relu"]
    skip = optimized.graph.node[0]
    assert list(skip.output) == ["y", "", "", "s"]  # mean and inv_std are not asked for
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-5)


def test_keep_sum_form_is_not_for_plain_onnx() -> None:
    model = add_layer_norm(add_escapes=True)
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="onnx")
    assert rewrites(report, "FuseSkipLayerNorm") == 0
    assert op_types(optimized) == ["Add", "LayerNormalization"]


def test_broadcast_skip_does_not_fuse() -> None:
    model = add_layer_norm(skip_shape=(1, 4, H))
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu")
    assert rewrites(report, "FuseSkipLayerNorm") == 0
    assert "not known to be equal" in report.rules["FuseSkipLayerNorm"].near_misses[0].reason


# --------------------------------------------------------------------------- tiny BERT, both exporters

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: E402

_RULES = ["FuseLayerNorm", "FuseSkipLayerNorm", "FuseGeluErf"]

# Both exporters already emit LayerNormalization (5: embeddings + 2 per layer), so
# FuseLayerNorm finds nothing. The residual Add before the 4 encoder LayerNorms
# becomes SkipLayerNorm on onnxruntime; the embeddings' Add is not fused because
# the position embeddings are [1, seq, H] (broadcast). Dynamo (opset 20) emits Gelu
# itself; TorchScript (opset 17) writes the Erf form twice, which only onnxruntime
# can fuse below opset 20.
_EXPECTED = {
    ("bert-tiny-dynamo", "onnx"): ({}, {("", "LayerNormalization"): 5, ("", "Gelu"): 2}),
    ("bert-tiny-dynamo", "ort-cpu"): (
        {"FuseSkipLayerNorm": 4},
        {("", "LayerNormalization"): 1, ("com.microsoft", "SkipLayerNormalization"): 4, ("", "Gelu"): 2},
    ),
    ("bert-tiny-torchscript", "onnx"): ({}, {("", "LayerNormalization"): 5, ("", "Erf"): 2}),
    ("bert-tiny-torchscript", "ort-cpu"): (
        {"FuseSkipLayerNorm": 4, "FuseGeluErf": 2},
        {("", "LayerNormalization"): 1, ("com.microsoft", "SkipLayerNormalization"): 4, ("com.microsoft", "Gelu"): 2},
    ),
}


@pytest.mark.parametrize("name, target", sorted(_EXPECTED))
def test_tiny_bert_normalization_and_gelu_fusions(name: str, target: str) -> None:
    source = models.TINY_MODELS[name]()
    optimized, report = graphopt.optimize(onnx.load(source), target=target, enable=_RULES, cost_table=SKIP_NORM_WINS)
    want_rewrites, want_ops = _EXPECTED[(name, target)]
    assert {r: rewrites(report, r) for r in _RULES} == {r: want_rewrites.get(r, 0) for r in _RULES}
    ops = Counter((n.domain, n.op_type) for n in optimized.graph.node)
    watched = {("", "LayerNormalization"), ("com.microsoft", "SkipLayerNormalization"), ("", "Gelu"), ("com.microsoft", "Gelu"), ("", "Erf")}
    assert {k: v for k, v in ops.items() if k in watched} == want_ops
    result = verify(source, optimized)
    assert result.passed, result.message


@pytest.mark.parametrize("bias_on_skip_side", [False, True])
def test_projection_bias_folds_into_skip_layer_norm(bias_on_skip_side: bool) -> None:
    # dense = x @ W + b; LayerNorm(dense + residual): the bias becomes SkipLayerNormalization's 5th input.
    add_inputs = ["r", "dense"] if bias_on_skip_side else ["dense", "r"]
    model = make_model(
        [
            helper.make_node("MatMul", ["x", "w"], ["mm"]),
            helper.make_node("Add", ["mm", "b"], ["dense"]),
            helper.make_node("Add", add_inputs, ["s"]),
            helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-6),
        ],
        [helper.make_tensor_value_info("x", F, ["N", 4, H]), helper.make_tensor_value_info("r", F, ["N", 4, H])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("w", rand(H, H)), init("b", rand(H)), init("gamma", rand(H)), init("beta", rand(H))],
    )
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm", "FoldBiasIntoSkipLayerNorm"], target="ort-cpu")
    assert rewrites(report, "FoldBiasIntoSkipLayerNorm") == 1
    assert op_types(optimized) == ["MatMul", "SkipLayerNormalization"]
    skip = optimized.graph.node[1]
    assert list(skip.input) == ["mm", "r", "gamma", "beta", "b"]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-5)


def test_bias_that_is_not_per_feature_stays_an_add() -> None:
    model = make_model(
        [
            helper.make_node("Add", ["x", "b"], ["dense"]),
            helper.make_node("Add", ["dense", "r"], ["s"]),
            helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-6),
        ],
        [helper.make_tensor_value_info("x", F, ["N", 4, H]), helper.make_tensor_value_info("r", F, ["N", 4, H])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("b", rand(4, H)), init("gamma", rand(H)), init("beta", rand(H))],
    )
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm", "FoldBiasIntoSkipLayerNorm"], target="ort-cpu")
    assert rewrites(report, "FoldBiasIntoSkipLayerNorm") == 0
    assert op_types(optimized) == ["Add", "SkipLayerNormalization"]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- JAX/flax's second-moment LayerNorm


def second_moment_layer_norm(clamp: float | None = 0.0, opset: int = 23) -> onnx.ModelProto:
    """jax2onnx's LayerNorm: var = E[x^2] - E[x]^2, Max(var, clamp) (none: no Max), + eps, Sqrt, (x - mean) / std, * gamma + beta."""
    H = 8
    inits = [init("gamma", rand(H)), init("beta", rand(H)), init("eps", np.array(1e-6, np.float32))]
    if opset >= 18:  # axes an input from opset 18, an attribute before
        inits.append(init("axes", np.array([-1], np.int64)))

    def mean_of(x: str, out: str) -> onnx.NodeProto:
        if opset >= 18:
            return helper.make_node("ReduceMean", [x, "axes"], [out], keepdims=1)
        return helper.make_node("ReduceMean", [x], [out], axes=[-1], keepdims=1)

    var = "var"
    nodes = [
        mean_of("x", "mean"),
        helper.make_node("Sub", ["x", "mean"], ["centered"]),
        helper.make_node("Mul", ["x", "x"], ["squared"]),
        mean_of("squared", "second"),
        helper.make_node("Mul", ["mean", "mean"], ["mean_squared"]),
        helper.make_node("Sub", ["second", "mean_squared"], ["var"]),
    ]
    if clamp is not None:
        inits.append(init("clamp", np.array(clamp, np.float32)))
        nodes.append(helper.make_node("Max", ["var", "clamp"], ["nonneg"]))
        var = "nonneg"
    nodes += [
        helper.make_node("Add", [var, "eps"], ["var_eps"]),
        helper.make_node("Sqrt", ["var_eps"], ["std"]),
        helper.make_node("Div", ["centered", "std"], ["normalized"]),
        helper.make_node("Mul", ["normalized", "gamma"], ["scaled"]),
        helper.make_node("Add", ["scaled", "beta"], ["y"]),
    ]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, H])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits, opset=opset)
    if opset >= 23:
        model.ir_version = 11
    return model


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("clamp", [0.0, None], ids=["max-0", "no-max"])
@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
def test_second_moment_layer_norm_fuses(clamp: float | None, target: str, opset: int) -> None:
    model = second_moment_layer_norm(clamp, opset=opset)
    optimized, report = optimize_with(model, ["FuseLayerNormSecondMoment"], target=target)
    assert rewrites(report, "FuseLayerNormSecondMoment") == 1
    assert op_types(optimized) == ["LayerNormalization"]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


def test_second_moment_layer_norm_clamped_elsewhere_than_zero_does_not_fuse() -> None:
    optimized, report = optimize_with(second_moment_layer_norm(clamp=0.5), ["FuseLayerNormSecondMoment"], target="onnx")
    assert rewrites(report, "FuseLayerNormSecondMoment") == 0 and "LayerNormalization" not in op_types(optimized)


def test_second_moment_layer_norm_below_opset_17_does_not_fuse() -> None:
    optimized, report = optimize_with(second_moment_layer_norm(opset=13), ["FuseLayerNormSecondMoment"], target="onnx")
    assert rewrites(report, "FuseLayerNormSecondMoment") == 0
