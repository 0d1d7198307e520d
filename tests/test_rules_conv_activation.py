"""Golden tests for conv_activation.pdll, and the capability table (dtypes and kernel
contracts) that gates it per target.

FusedConv is a decision (graphopt/passes/fused_conv.py): unless the cost table predicts it
faster, it is split back into the input's Conv + activation. The golden tests here look
at the rules' output, so they optimize with a table in which FusedConv wins
(`FUSED_CONV_WINS`); tests/test_decisions.py checks the default."""

from __future__ import annotations

import functools
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from rule_testing import FUSED_CONV_WINS, TensorProto, assert_same_outputs, helper, init, make_model, op_types, rand, rewrites
from rule_testing import optimize_with as _optimize_with

optimize_with = functools.partial(_optimize_with, cost_table=FUSED_CONV_WINS)

CONV_RULES = [
    "FuseConvActivation",
    "FuseConvAddRelu", "FuseConvAdd", "FoldPadIntoConv",
]


def _conv(inp: str = "x", out: str = "c", **attrs):
    return helper.make_node("Conv", [inp, "w", "b"], [out], pads=[1, 1, 1, 1], **attrs)


def _weights(dtype=np.float32, cin: int = 3, cout: int = 4):
    return [init("w", rand(cout, cin, 3, 3).astype(dtype)), init("b", rand(cout).astype(dtype))]


def conv_act(act_nodes, dtype=TensorProto.FLOAT, opset: int = 17, extra_inits=()) -> onnx.ModelProto:
    np_dtype = np.float32 if dtype == TensorProto.FLOAT else np.float16
    return make_model(
        [_conv(), *act_nodes],
        [helper.make_tensor_value_info("x", dtype, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", dtype, None)],
        [*_weights(np_dtype), *extra_inits],
        opset=opset,
    )


def conv_relu(dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    return conv_act([helper.make_node("Relu", ["c"], ["y"])], dtype)


def fused(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "FusedConv"]


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# ------------------------------------------------------------------ Conv + Relu


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_conv_relu_fuses_on_onnxruntime_targets(target: str) -> None:
    model = conv_relu()
    optimized, report = optimize_with(model, ["FuseConvActivation"], target=target, layout="nchw")
    assert rewrites(report, "FuseConvActivation") == 1
    assert [(n.domain, n.op_type) for n in optimized.graph.node] == [("com.microsoft", "FusedConv")]
    assert attrs(fused(optimized)[0])["activation"] == b"Relu"
    if target == "ort-cpu":
        assert_same_outputs(model, optimized)


def test_conv_relu_is_not_fused_for_plain_onnx() -> None:
    model = conv_relu()
    optimized, report = optimize_with(model, ["FuseConvActivation"], target="onnx")
    assert rewrites(report, "FuseConvActivation") == 0
    assert op_types(optimized) == ["Conv", "Relu"]
    assert "no lowering" in report.rules["FuseConvActivation"].near_misses[0].reason


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_conv_relu_in_f16_is_not_fused_where_the_kernel_is_f32_only(target: str) -> None:
    model = conv_relu(TensorProto.FLOAT16)
    optimized, report = optimize_with(model, ["FuseConvActivation"], target=target, layout="nchw")
    assert rewrites(report, "FuseConvActivation") == 0
    assert op_types(optimized) == ["Conv", "Relu"]
    assert "FusedConv kernel for f16" in report.rules["FuseConvActivation"].near_misses[0].reason


def test_conv_with_a_second_user_is_not_fused() -> None:
    model = conv_act([helper.make_node("Relu", ["c"], ["y"]), helper.make_node("Sigmoid", ["c"], ["y2"])])
    model.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, None))
    optimized, report = optimize_with(model, CONV_RULES, target="ort-cpu")
    assert report.total_rewrites == 0
    assert sorted(op_types(optimized)) == ["Conv", "Relu", "Sigmoid"]


# ------------------------------------------------------------------ other activations


def _clip13(lo: float | None, hi: float | None):
    inputs = ["c", "lo" if lo is not None else "", "hi" if hi is not None else ""]
    while inputs[-1] == "":
        inputs.pop()
    inits = [init(n, np.array(v, np.float32)) for n, v in (("lo", lo), ("hi", hi)) if v is not None]
    return [helper.make_node("Clip", inputs, ["y"])], inits


ACTIVATIONS = {
    # name: (activation nodes, extra initializers, opset, rule, expected activation, expected params)
    "tanh": ([helper.make_node("Tanh", ["c"], ["y"])], [], 17, "FuseConvActivation", "Tanh", None),
    "sigmoid": ([helper.make_node("Sigmoid", ["c"], ["y"])], [], 17, "FuseConvActivation", "Sigmoid", None),
    "leaky_relu": ([helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.2)], [], 17, "FuseConvActivation", "LeakyRelu", [0.2]),
    "leaky_relu_default": ([helper.make_node("LeakyRelu", ["c"], ["y"])], [], 17, "FuseConvActivation", "LeakyRelu", [0.01]),
    "hard_sigmoid": ([helper.make_node("HardSigmoid", ["c"], ["y"], alpha=0.3, beta=0.4)], [], 17, "FuseConvActivation", "HardSigmoid", [0.3, 0.4]),
    # ReLU6 as both exporters write it: Clip with constant min/max inputs (opset >= 11) ...
    "relu6": (*_clip13(0.0, 6.0), 17, "FuseConvActivation", "Clip", [0.0, 6.0]),
    "clip_min_only": (*_clip13(-1.0, None), 17, "FuseConvActivation", "Clip", [-1.0, float(np.finfo(np.float32).max)]),
    # ... and before opset 11, with attributes.
    "relu6_opset6": ([helper.make_node("Clip", ["c"], ["y"], min=0.0, max=6.0)], [], 10, "FuseConvActivation", "Clip", [0.0, 6.0]),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_conv_activation_fuses_on_ort_cpu(name: str) -> None:
    nodes, inits, opset, rule, activation, params = ACTIVATIONS[name]
    model = conv_act(nodes, opset=opset, extra_inits=inits)
    optimized, report = optimize_with(model, CONV_RULES, target="ort-cpu")
    assert rewrites(report, rule) == 1 and report.total_rewrites == 1
    # One rule for every activation; the report still says which one it fused.
    assert [r.op for r in report.rules[rule].rewrites] == [nodes[-1].op_type]
    [node] = fused(optimized)
    a = attrs(node)
    assert a["activation"] == activation.encode()
    if params is None:
        assert "activation_params" not in a
    else:
        np.testing.assert_allclose(a["activation_params"], params, rtol=1e-6)
    assert op_types(optimized) == ["FusedConv"]
    assert_same_outputs(model, optimized)


@pytest.mark.parametrize("name", ["tanh", "sigmoid", "leaky_relu", "hard_sigmoid", "relu6"])
def test_activations_the_cuda_kernel_lacks_are_not_fused_there(name: str) -> None:
    nodes, inits, opset, rule, _, _ = ACTIVATIONS[name]
    optimized, report = optimize_with(conv_act(nodes, opset=opset, extra_inits=inits), CONV_RULES, target="ort-cuda", layout="nchw")
    assert report.total_rewrites == 0
    assert "Conv" in op_types(optimized) and not fused(optimized)
    assert "activations are Relu" in report.rules[rule].near_misses[0].reason


def test_clip_with_computed_bounds_is_not_fused() -> None:
    model = conv_act([helper.make_node("Clip", ["c", "lo"], ["y"])])
    model.graph.input.append(helper.make_tensor_value_info("lo", TensorProto.FLOAT, []))
    optimized, report = optimize_with(model, CONV_RULES, target="ort-cpu")
    assert rewrites(report, "FuseConvActivation") == 0
    assert op_types(optimized) == ["Conv", "Clip"]


# ------------------------------------------------------------------ residual Add (Z input)


def conv_add(relu: bool, z_shape=(1, 4, 6, 6), z_const: bool = False) -> onnx.ModelProto:
    nodes = [_conv(), helper.make_node("Add", ["c", "z"] if not z_const else ["zc", "c"], ["s" if relu else "y"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["s"], ["y"]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])]
    inits = _weights()
    if z_const:
        inits.append(init("zc", rand(*z_shape)))
    else:
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, list(z_shape)))
    return make_model(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_conv_add_relu_fuses_with_z(target: str) -> None:
    model = conv_add(relu=True)
    optimized, report = optimize_with(model, CONV_RULES, target=target, layout="nchw")
    assert rewrites(report, "FuseConvAddRelu") == 1
    [node] = fused(optimized)
    assert list(node.input) == ["x", "w", "b", "z"] and attrs(node)["activation"] == b"Relu"
    assert op_types(optimized) == ["FusedConv"]
    if target == "ort-cpu":
        assert_same_outputs(model, optimized)


def test_conv_add_then_relu_fuses_in_two_steps() -> None:
    # When Conv + Add fused first (no activation), the activation rule takes the FusedConv.
    model = conv_add(relu=True)
    optimized, report = optimize_with(model, ["FuseConvAdd", "FuseConvActivation"], target="ort-cpu")
    assert rewrites(report, "FuseConvAdd") == 1 and rewrites(report, "FuseConvActivation") == 1
    [node] = fused(optimized)
    assert list(node.input) == ["x", "w", "b", "z"] and attrs(node)["activation"] == b"Relu"
    assert_same_outputs(model, optimized)


def test_a_fused_conv_takes_one_activation_only() -> None:
    model = conv_act([helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])])
    optimized, report = optimize_with(model, CONV_RULES, target="ort-cpu")
    assert rewrites(report, "FuseConvActivation") == 1
    assert [r.op for r in report.rules["FuseConvActivation"].rewrites] == ["Relu"]
    assert op_types(optimized) == ["FusedConv", "Sigmoid"]
    assert any("already applies Relu" in m.reason for m in report.rules["FuseConvActivation"].near_misses)


def test_conv_add_without_activation_fuses_on_cpu_only() -> None:
    model = conv_add(relu=False)
    optimized, report = optimize_with(model, CONV_RULES, target="ort-cpu")
    assert rewrites(report, "FuseConvAdd") == 1
    [node] = fused(optimized)
    assert len(node.input) == 4 and "activation" not in attrs(node)
    assert_same_outputs(model, optimized)
    optimized, report = optimize_with(model, CONV_RULES, target="ort-cuda", layout="nchw")
    assert report.total_rewrites == 0 and op_types(optimized) == ["Conv", "Add"]
    assert "activations are Relu, not None" in report.rules["FuseConvAdd"].near_misses[0].reason


@pytest.mark.parametrize("z_const", [False, True])
def test_broadcast_add_is_not_a_residual(z_const: bool) -> None:
    model = conv_add(relu=True, z_shape=(1, 4, 1, 1), z_const=z_const)
    optimized, report = optimize_with(model, ["FuseConvAddRelu", "FuseConvAdd"], target="ort-cpu")
    assert report.total_rewrites == 0
    assert op_types(optimized) == ["Conv", "Add", "Relu"]


# ------------------------------------------------------------------ Pad + Conv + activation


def test_pad_conv_relu_becomes_one_fused_conv_with_pads() -> None:
    pads = init("pads", np.array([0, 0, 1, 2, 0, 0, 1, 2], np.int64))
    model = make_model(
        [helper.make_node("Pad", ["x", "pads"], ["p"]), helper.make_node("Conv", ["p", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [*_weights(), pads],
    )
    optimized, report = optimize_with(model, CONV_RULES, target="ort-cpu")
    assert rewrites(report, "FuseConvActivation") == 1 and rewrites(report, "FoldPadIntoConv") == 1
    [node] = fused(optimized)
    assert attrs(node)["pads"] == [1, 2, 1, 2]
    assert op_types(optimized) == ["FusedConv"]
    assert_same_outputs(model, optimized)


# ------------------------------------------------------------------ exported CNNs

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: E402

EXPORTED = [
    # (builder, exporter, target, expected rewrites per rule, FusedConv nodes after)
    ("resnet_tiny", "dynamo-noopt", "ort-cpu", {"FuseConvActivation": 49, "FuseConvAdd": 16}, 49),
    ("resnet_tiny", "dynamo-noopt", "ort-cuda", {"FuseConvActivation": 33, "FuseConvAddRelu": 16}, 49),
    ("mobilenet_tiny", "dynamo-noopt", "ort-cpu", {"FuseConvActivation": 35, "FuseConvAdd": 11}, 46),
    ("mobilenet_tiny", "torchscript", "ort-cpu", {"FuseConvActivation": 35, "FuseConvAdd": 11}, 46),
    ("small_cnn", "dynamo-noopt", "ort-cpu", {"FuseConvActivation": 3, "FoldPadIntoConv": 1}, 3),
]


@pytest.mark.parametrize("builder,exporter,target,expected,count", EXPORTED, ids=[f"{b}-{e}-{t}" for b, e, t, _, _ in EXPORTED])
def test_exported_cnn_conv_fusions(builder: str, exporter: str, target: str, expected: dict[str, int], count: int) -> None:
    pytest.importorskip("torch")
    path = getattr(models, builder)(exporter)
    optimized, report = optimize_with(onnx.load(path), None, target=target, layout="nchw")
    assert {rule: rewrites(report, rule) for rule in CONV_RULES if rewrites(report, rule)} == expected
    assert Counter((n.domain, n.op_type) for n in optimized.graph.node)[("com.microsoft", "FusedConv")] == count
    if target == "ort-cpu":
        from graphopt.verify import verify

        result = verify(onnx.load(path), optimized)
        assert result.passed, result.message


# ------------------------------------------------------------------ on FX graphs (the torch backend)
# The positive cases are in tests/both_kinds_cases.py (the same module on ONNX and FX).


def _fx_outcome(rule: str, module, inputs):
    import torch.nn.functional as F  # noqa: F401  (used by the modules below)
    from both_kinds import Case, run_case

    outcome = run_case(Case(rule, module, inputs, 0, kinds=("fx",)))
    assert outcome.fx_problem is None, outcome.fx_problem
    return outcome


def test_fx_conv_add_of_a_broadcast_tensor_is_not_a_residual() -> None:
    import torch.nn.functional as F
    from both_kinds_cases import const, fn
    from both_kinds_cases import rand as inputs

    module = fn(lambda m, x: F.conv2d(x, m.w, padding=1) + m.z, w=const(4, 3, 3, 3), z=const(4, 1, 1))
    outcome = _fx_outcome("FuseConvAdd", module, inputs(1, 3, 6, 6))
    assert outcome.fx_rewrites == 0 and outcome.fx_misses, "FuseConvAdd took a [4, 1, 1] addend as Z"


def test_fx_conv_read_twice_keeps_its_activation_apart() -> None:
    import torch.nn.functional as F
    from both_kinds_cases import const, fn
    from both_kinds_cases import rand as inputs

    module = fn(lambda m, x: (lambda c: (F.relu(c), c * 2.0))(F.conv2d(x, m.w, m.b, padding=1)), w=const(4, 3, 3, 3), b=const(4))
    assert _fx_outcome("FuseConvActivation", module, inputs(1, 3, 6, 6)).fx_rewrites == 0
