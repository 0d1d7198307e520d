"""Golden tests for hard_activations.pdll: HardSigmoid, HardSwish, Softplus and Mish written out."""

from __future__ import annotations

import numpy as np
import pytest
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, rewrites

F = TensorProto.FLOAT
HARD_RULES = ["FuseHardSigmoid", "FuseHardSwish", "FuseHardSwishFromHardSigmoid"]


def scalars(**values: float):
    return [init(k, np.array(v, np.float32)) for k, v in values.items()]


def clip(inp: str, out: str, opset: int, lo: float = 0.0, hi: float = 6.0):
    """relu6 as the exporters write it: bounds as inputs from opset 11, attributes before."""
    if opset >= 11:
        return helper.make_node("Clip", [inp, "lo", "hi"], [out]), scalars(lo=lo, hi=hi)
    return helper.make_node("Clip", [inp], [out], min=lo, max=hi), []


def model_of(nodes, inits, opset: int, shape=(2, 8, 5, 5)):
    return make_model(nodes, [helper.make_tensor_value_info("x", F, list(shape))], [helper.make_tensor_value_info("y", F, None)],
                      inits, opset=opset)


def wide_inputs(model):
    """Inputs over [-8, 8]: both saturations of relu6(x + 3) and the linear part in between."""
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(0).uniform(-8, 8, shape).astype(np.float32)}


@pytest.mark.parametrize("opset", [9, 13])
@pytest.mark.parametrize("scale", ["div", "mul"])
def test_hard_sigmoid_written_out(opset: int, scale: str) -> None:
    c, c_inits = clip("a", "c", opset)
    last = helper.make_node("Div", ["c", "six"], ["y"]) if scale == "div" else helper.make_node("Mul", ["c", "sixth"], ["y"])
    model = model_of([helper.make_node("Add", ["x", "three"], ["a"]), c, last],
                     c_inits + scalars(three=3.0, six=6.0, sixth=1.0 / 6.0), opset)
    optimized, report = optimize_with(model, HARD_RULES)
    assert rewrites(report, "FuseHardSigmoid") == 1
    assert op_types(optimized) == ["HardSigmoid"]
    attrs = {a.name: helper.get_attribute_value(a) for a in optimized.graph.node[0].attribute}
    assert attrs["alpha"] == pytest.approx(1 / 6) and attrs["beta"] == pytest.approx(0.5)
    assert_same_outputs(model, optimized, feeds=wide_inputs(model))


def test_hard_sigmoid_other_offset_and_ceiling() -> None:
    """clip(x + 1, 0, 2) / 2 is HardSigmoid(alpha 0.5, beta 0.5) (paddle's slope forms)."""
    c, c_inits = clip("a", "c", 13, 0.0, 2.0)
    model = model_of([helper.make_node("Add", ["x", "one"], ["a"]), c, helper.make_node("Div", ["c", "two"], ["y"])],
                     c_inits + scalars(one=1.0, two=2.0), 13)
    optimized, report = optimize_with(model, HARD_RULES)
    assert rewrites(report, "FuseHardSigmoid") == 1
    assert op_types(optimized) == ["HardSigmoid"]
    assert_same_outputs(model, optimized, feeds=wide_inputs(model))


@pytest.mark.parametrize("opset, expected", [(11, ["HardSigmoid", "Mul"]), (14, ["HardSwish"])])
@pytest.mark.parametrize("scale", ["div", "mul"])
def test_hard_swish_written_out(opset: int, expected: list[str], scale: str) -> None:
    c, c_inits = clip("a", "c", opset)
    last = helper.make_node("Div", ["m", "six"], ["y"]) if scale == "div" else helper.make_node("Mul", ["m", "sixth"], ["y"])
    model = model_of([helper.make_node("Add", ["x", "three"], ["a"]), c, helper.make_node("Mul", ["x", "c"], ["m"]), last],
                     c_inits + scalars(three=3.0, six=6.0, sixth=1.0 / 6.0), opset)
    optimized, report = optimize_with(model, HARD_RULES)
    assert rewrites(report, "FuseHardSwish") == 1
    assert rewrites(report, "FuseHardSwishFromHardSigmoid") == (1 if opset >= 14 else 0)
    assert sorted(op_types(optimized)) == sorted(expected)
    assert_same_outputs(model, optimized, feeds=wide_inputs(model))


def test_hard_swish_stays_composed_on_ort_cpu() -> None:
    """onnxruntime's CPU provider lists no HardSwish kernel: x * HardSigmoid(x) stays."""
    c, c_inits = clip("a", "c", 14)
    model = model_of([helper.make_node("Add", ["x", "three"], ["a"]), c, helper.make_node("Mul", ["x", "c"], ["m"]),
                      helper.make_node("Div", ["m", "six"], ["y"])], c_inits + scalars(three=3.0, six=6.0), 14)
    optimized, report = optimize_with(model, HARD_RULES, target="ort-cpu")
    assert rewrites(report, "FuseHardSwish") == 1
    assert rewrites(report, "FuseHardSwishFromHardSigmoid") == 0
    assert sorted(op_types(optimized)) == ["HardSigmoid", "Mul"]
    assert_same_outputs(model, optimized, feeds=wide_inputs(model))


def test_mul_by_hard_sigmoid_is_hard_swish() -> None:
    model = model_of([helper.make_node("HardSigmoid", ["x"], ["h"], alpha=1.0 / 6.0, beta=0.5), helper.make_node("Mul", ["h", "x"], ["y"])],
                     [], 17)
    optimized, report = optimize_with(model, HARD_RULES)
    assert rewrites(report, "FuseHardSwishFromHardSigmoid") == 1
    assert op_types(optimized) == ["HardSwish"]
    assert_same_outputs(model, optimized, feeds=wide_inputs(model))


def test_wrong_constants_do_not_fuse() -> None:
    """x * relu6(x + 2) / 6 is not HardSwish; clip(x + 3, 0, 6) / 5 is no HardSigmoid; HardSigmoid(0.2) times x is not HardSwish."""
    c, c_inits = clip("a", "c", 13)
    not_swish = model_of([helper.make_node("Add", ["x", "two"], ["a"]), c, helper.make_node("Mul", ["x", "c"], ["m"]),
                          helper.make_node("Div", ["m", "six"], ["y"])], c_inits + scalars(two=2.0, six=6.0), 13)
    optimized, report = optimize_with(not_swish, HARD_RULES)
    assert rewrites(report, "FuseHardSwish") == 0
    assert "not HardSwish" in report.rules["FuseHardSwish"].near_misses[0].reason
    assert len(optimized.graph.node) == 4

    c, c_inits = clip("a", "c", 13)
    not_sigmoid = model_of([helper.make_node("Add", ["x", "three"], ["a"]), c, helper.make_node("Div", ["c", "five"], ["y"])],
                           c_inits + scalars(three=3.0, five=5.0), 13)
    optimized, report = optimize_with(not_sigmoid, HARD_RULES)
    assert rewrites(report, "FuseHardSigmoid") == 0 and len(optimized.graph.node) == 3

    paddle_sigmoid = model_of([helper.make_node("HardSigmoid", ["x"], ["h"], alpha=0.2, beta=0.5), helper.make_node("Mul", ["x", "h"], ["y"])],
                              [], 17)
    optimized, report = optimize_with(paddle_sigmoid, HARD_RULES)
    assert rewrites(report, "FuseHardSwishFromHardSigmoid") == 0 and sorted(op_types(optimized)) == ["HardSigmoid", "Mul"]


def test_clip_used_elsewhere_does_not_fuse() -> None:
    c, c_inits = clip("a", "c", 13)
    model = make_model([helper.make_node("Add", ["x", "three"], ["a"]), c, helper.make_node("Div", ["c", "six"], ["y"]),
                        helper.make_node("Relu", ["c"], ["r"])],
                       [helper.make_tensor_value_info("x", F, [2, 4])],
                       [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("r", F, None)],
                       c_inits + scalars(three=3.0, six=6.0), opset=13)
    optimized, report = optimize_with(model, HARD_RULES)
    assert rewrites(report, "FuseHardSigmoid") == 0
    assert len(optimized.graph.node) == 4


def test_softplus_and_mish_written_out() -> None:
    model = model_of([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Add", ["one", "e"], ["a"]), helper.make_node("Log", ["a"], ["sp"]),
                      helper.make_node("Tanh", ["sp"], ["t"]), helper.make_node("Mul", ["x", "t"], ["y"])], scalars(one=1.0), 18)
    optimized, report = optimize_with(model, ["FuseSoftplus", "FuseMish"])
    assert rewrites(report, "FuseSoftplus") == 1 and rewrites(report, "FuseMish") == 1
    assert op_types(optimized) == ["Mish"]
    assert_same_outputs(model, optimized, feeds=wide_inputs(model))


def test_mish_below_opset_18_keeps_softplus_form() -> None:
    model = model_of([helper.make_node("Softplus", ["x"], ["sp"]), helper.make_node("Tanh", ["sp"], ["t"]), helper.make_node("Mul", ["t", "x"], ["y"])],
                     [], 17)
    optimized, report = optimize_with(model, ["FuseSoftplus", "FuseMish"])
    assert rewrites(report, "FuseMish") == 0
    assert "opset is 17" in report.rules["FuseMish"].near_misses[0].reason
    assert len(optimized.graph.node) == 3


def test_log_of_exp_plus_two_is_not_softplus() -> None:
    model = model_of([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Add", ["e", "two"], ["a"]), helper.make_node("Log", ["a"], ["y"])],
                     scalars(two=2.0), 17)
    optimized, report = optimize_with(model, ["FuseSoftplus"])
    assert rewrites(report, "FuseSoftplus") == 0 and len(optimized.graph.node) == 3


def softplus_written_out():
    return model_of([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Log", ["a"], ["y"])],
                    scalars(one=1.0), 18)


def test_softplus_stays_written_out_on_ort_cpu() -> None:
    """onnxruntime's CPU Softplus is slower than Exp + Add + Log (standard_ops.py): ort-cpu keeps the input's form."""
    model = softplus_written_out()
    optimized, report = optimize_with(model, ["FuseSoftplus"], target="ort-cpu")
    assert rewrites(report, "FuseSoftplus") == 0
    assert op_types(optimized) == ["Exp", "Add", "Log"]
    assert "slower than the ops it would replace" in report.rules["FuseSoftplus"].near_misses[0].reason


@pytest.mark.parametrize("target", ["onnx", "ort-cuda"])
def test_softplus_folds_on_other_targets(target: str) -> None:
    model = softplus_written_out()
    optimized, report = optimize_with(model, ["FuseSoftplus"], target=target)
    assert rewrites(report, "FuseSoftplus") == 1
    assert op_types(optimized) == ["Softplus"]
    assert_same_outputs(model, optimized, feeds=wide_inputs(model))


def test_models_own_softplus_is_kept_on_ort_cpu() -> None:
    """Only a new Softplus is refused: the model's own stays as it came (and Mish has no CPU kernel)."""
    model = model_of([helper.make_node("Softplus", ["x"], ["sp"]), helper.make_node("Tanh", ["sp"], ["t"]), helper.make_node("Mul", ["t", "x"], ["y"])],
                     [], 18)
    optimized, report = optimize_with(model, None, target="ort-cpu")
    assert op_types(optimized) == ["Softplus", "Tanh", "Mul"]
    assert_same_outputs(model, optimized, feeds=wide_inputs(model))
