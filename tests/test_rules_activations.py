"""Golden tests for activations.pdll: the Erf form of GELU -> Gelu (opset >= 20) or graphopt.Gelu (com.microsoft.Gelu)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, rewrites

F = TensorProto.FLOAT
RULES = ["FuseGeluErf"]


def gelu_erf(scale: str = "div", place: str = "after", opset: int = 17, half: float = 0.5) -> onnx.ModelProto:
    """y = x * 0.5 * (1 + Erf(x / sqrt(2))) in one of the forms exporters write."""
    inits = [init("one", np.array(1.0, np.float32)), init("half", np.array(half, np.float32))]
    if scale == "div":
        inits.append(init("s", np.array(math.sqrt(2.0), np.float32)))
        nodes = [helper.make_node("Div", ["x", "s"], ["xs"])]
    else:
        inits.append(init("s", np.array(1.0 / math.sqrt(2.0), np.float32)))
        nodes = [helper.make_node("Mul", ["s", "x"], ["xs"])]
    nodes += [helper.make_node("Erf", ["xs"], ["e"]), helper.make_node("Add", ["one", "e"], ["e1"])]
    if place == "after":  # (x * (1 + erf)) * 0.5, as torch.onnx (TorchScript) writes F.gelu
        nodes += [helper.make_node("Mul", ["x", "e1"], ["p"]), helper.make_node("Mul", ["p", "half"], ["y"])]
    else:  # (x * 0.5) * (1 + erf), as transformers' python GELU writes it
        nodes += [helper.make_node("Mul", ["half", "x"], ["p"]), helper.make_node("Mul", ["p", "e1"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [2, 16])], [helper.make_tensor_value_info("y", F, None)], inits, opset=opset)
    if opset >= 20:
        model.ir_version = 9
    return model


FORMS = [(s, p) for s in ("div", "mul") for p in ("after", "before")]


@pytest.mark.parametrize("scale, place", FORMS)
def test_gelu_erf_becomes_contrib_gelu_on_ort_cpu_below_opset_20(scale: str, place: str) -> None:
    model = gelu_erf(scale, place)
    optimized, report = optimize_with(model, RULES, target="ort-cpu")
    assert rewrites(report, "FuseGeluErf") == 1
    assert [(n.domain, n.op_type) for n in optimized.graph.node] == [("com.microsoft", "Gelu")]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
@pytest.mark.parametrize("scale, place", FORMS)
def test_gelu_erf_becomes_standard_gelu_from_opset_20(scale: str, place: str, target: str) -> None:
    model = gelu_erf(scale, place, opset=20)
    optimized, report = optimize_with(model, RULES, target=target)
    assert rewrites(report, "FuseGeluErf") == 1
    assert [(n.domain, n.op_type) for n in optimized.graph.node] == [("", "Gelu")]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset, op", [(17, ("com.microsoft", "Gelu")), (20, ("", "Gelu"))])
def test_gelu_erf_on_ort_cuda_emits_the_op(opset: int, op: tuple[str, str]) -> None:
    optimized, report = optimize_with(gelu_erf(opset=opset), RULES, target="ort-cuda")
    assert rewrites(report, "FuseGeluErf") == 1
    assert [(n.domain, n.op_type) for n in optimized.graph.node] == [op]


def test_gelu_erf_is_not_fused_for_plain_onnx_below_opset_20() -> None:
    model = gelu_erf(opset=17)
    optimized, report = optimize_with(model, RULES, target="onnx")
    assert rewrites(report, "FuseGeluErf") == 0
    assert len(optimized.graph.node) == 5
    # Below opset 20 the rule builds graphopt.Gelu, which plain ONNX cannot run.
    assert "no lowering" in report.rules["FuseGeluErf"].near_misses[0].reason


@pytest.mark.parametrize("place", ["after", "before"])
@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
def test_gelu_with_a_wrong_constant_does_not_fuse(place: str, target: str) -> None:
    model = gelu_erf(place=place, opset=20, half=0.6)
    optimized, report = optimize_with(model, RULES, target=target)
    assert rewrites(report, "FuseGeluErf") == 0
    assert len(optimized.graph.node) == 5
    assert "expected 0.5" in report.rules["FuseGeluErf"].near_misses[0].reason


def test_gelu_whose_erf_term_has_another_user_does_not_fuse() -> None:
    model = gelu_erf()
    model.graph.output.append(helper.make_tensor_value_info("e1", F, None))
    optimized, report = optimize_with(model, RULES, target="ort-cpu")
    assert rewrites(report, "FuseGeluErf") == 0
    assert op_types(optimized).count("Erf") == 1
