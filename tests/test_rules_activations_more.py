"""Golden tests for the tanh GELU, bias GELU and QuickGELU rules of activations.pdll."""

from __future__ import annotations

import importlib.util
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, ort_has_kernel, rewrites

import graphopt
from graphopt.verify import verify

F = TensorProto.FLOAT
TANH_RULES = ["FuseGeluTanh"]
BIAS_RULES = ["FuseGeluErf", "FuseGeluTanh", "FuseBiasGelu"]
MS = "com.microsoft"


def _ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in model.graph.node]


def _model(nodes, inits, opset: int, shape=(2, 16)) -> onnx.ModelProto:
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, list(shape))], [helper.make_tensor_value_info("y", F, None)], inits, opset=opset)
    if opset >= 20:
        model.ir_version = 9
    return model


def gelu_tanh(cube: str = "pow", place: str = "before", opset: int = 17, k: float = 0.044715, x: str = "x", prefix=(), inits=(), shape=(2, 16)):
    """y = 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) as GPT-2's NewGELU exports it."""
    inits = [
        *inits,
        init("half", np.array(0.5, np.float32)),
        init("three", np.array(3.0, np.float32)),
        init("k", np.array(k, np.float32)),
        init("s", np.array(math.sqrt(2.0 / math.pi), np.float32)),
        init("one", np.array(1.0, np.float32)),
    ]
    nodes = list(prefix)
    if cube == "pow":
        nodes += [helper.make_node("Pow", [x, "three"], ["c"]), helper.make_node("Mul", ["c", "k"], ["kc"])]
    elif cube == "mul":
        nodes += [helper.make_node("Mul", [x, x], ["sq"]), helper.make_node("Mul", ["sq", x], ["c"]), helper.make_node("Mul", ["c", "k"], ["kc"])]
    else:  # "chain": 0.044715 * x * x * x as hand-written code has it, left to right
        nodes += [helper.make_node("Mul", ["k", x], ["k1"]), helper.make_node("Mul", ["k1", x], ["k2"]), helper.make_node("Mul", ["k2", x], ["kc"])]
    nodes += [
        helper.make_node("Add", [x, "kc"], ["inner"]),
        helper.make_node("Mul", ["inner", "s"], ["arg"]),
        helper.make_node("Tanh", ["arg"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["t1"]),
    ]
    if place == "before":  # (x * 0.5) * (1 + tanh), as both torch exporters write NewGELU
        nodes += [helper.make_node("Mul", [x, "half"], ["p"]), helper.make_node("Mul", ["p", "t1"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", [x, "t1"], ["p"]), helper.make_node("Mul", ["half", "p"], ["y"])]
    return _model(nodes, inits, opset, shape)


def gelu_erf(x: str = "x", prefix=(), inits=(), shape=(2, 16)) -> onnx.ModelProto:
    inits = [*inits, init("one", np.array(1.0, np.float32)), init("half", np.array(0.5, np.float32)), init("sq2", np.array(math.sqrt(2.0), np.float32))]
    nodes = [
        *prefix,
        helper.make_node("Div", [x, "sq2"], ["xs"]),
        helper.make_node("Erf", ["xs"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", [x, "e1"], ["p"]),
        helper.make_node("Mul", ["p", "half"], ["y"]),
    ]
    return _model(nodes, inits, 17, shape)


TANH_FORMS = [(c, p) for c in ("pow", "mul", "chain") for p in ("before", "after")]


# --- FuseGeluTanh (FastGelu below opset 20, Gelu from 20) ---------------------------------------


@pytest.mark.parametrize("cube, place", TANH_FORMS)
def test_gelu_tanh_becomes_fast_gelu_on_ort_cpu_below_opset_20(cube: str, place: str) -> None:
    model = gelu_tanh(cube, place)
    optimized, report = optimize_with(model, TANH_RULES, target="ort-cpu")
    assert rewrites(report, "FuseGeluTanh") == 1
    assert _ops(optimized) == [(MS, "FastGelu")]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
@pytest.mark.parametrize("cube, place", TANH_FORMS)
def test_gelu_tanh_becomes_standard_gelu_from_opset_20(cube: str, place: str, target: str) -> None:
    model = gelu_tanh(cube, place, opset=20)
    optimized, report = optimize_with(model, TANH_RULES, target=target)
    assert rewrites(report, "FuseGeluTanh") == 1
    assert _ops(optimized) == [("", "Gelu")]
    attrs = {a.name: helper.get_attribute_value(a) for a in optimized.graph.node[0].attribute}
    assert attrs == {"approximate": b"tanh"}
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("opset, op", [(17, (MS, "FastGelu")), (20, ("", "Gelu"))])
def test_gelu_tanh_on_ort_cuda_emits_the_op(opset: int, op: tuple[str, str]) -> None:
    optimized, report = optimize_with(gelu_tanh(opset=opset), TANH_RULES, target="ort-cuda")
    assert rewrites(report, "FuseGeluTanh") == 1
    assert _ops(optimized) == [op]


def test_gelu_tanh_is_not_fused_for_plain_onnx_below_opset_20() -> None:
    model = gelu_tanh(opset=17)
    optimized, report = optimize_with(model, TANH_RULES, target="onnx")
    assert rewrites(report, "FuseGeluTanh") == 0
    assert len(optimized.graph.node) == 8
    # Below opset 20 the rule builds graphopt.FastGelu, which plain ONNX cannot run.
    assert "no lowering" in report.rules["FuseGeluTanh"].near_misses[0].reason


@pytest.mark.parametrize("cube", ["pow", "chain"])
@pytest.mark.parametrize("opset, target", [(17, "ort-cpu"), (20, "onnx")])
def test_gelu_tanh_with_a_wrong_constant_does_not_fuse(opset: int, target: str, cube: str) -> None:
    model = gelu_tanh(cube, opset=opset, k=0.05)
    optimized, report = optimize_with(model, TANH_RULES, target=target)
    assert rewrites(report, "FuseGeluTanh") == 0
    assert len(optimized.graph.node) == len(model.graph.node)
    assert "expected 0.044715" in report.rules["FuseGeluTanh"].near_misses[0].reason


def test_gelu_tanh_whose_tanh_term_has_another_user_does_not_fuse() -> None:
    model = gelu_tanh()
    model.graph.output.append(helper.make_tensor_value_info("t1", F, None))
    optimized, report = optimize_with(model, TANH_RULES, target="ort-cpu")
    assert rewrites(report, "FuseGeluTanh") == 0
    assert op_types(optimized).count("Tanh") == 1


# --- FuseBiasGelu (both GELU forms) --------------------------------------------


def _bias_prefix(bias: np.ndarray, const: bool = True):
    inits = [init("bias", bias)] if const else []
    return [helper.make_node("Add", ["x", "bias"], ["xb"])], inits


def bias_model(kind: str, bias: np.ndarray | None = None, const: bool = True, shape=(2, 3, 16)) -> onnx.ModelProto:
    bias = np.linspace(-1, 1, shape[-1]).astype(np.float32) if bias is None else bias
    prefix, inits = _bias_prefix(bias, const)
    build = gelu_erf if kind == "erf" else gelu_tanh
    model = build(x="xb", prefix=prefix, inits=inits, shape=shape)
    if not const:
        model.graph.input.append(helper.make_tensor_value_info("bias", F, list(bias.shape)))
    return model


def test_bias_add_feeding_the_new_gelu_becomes_bias_gelu_in_one_run() -> None:
    # FuseGeluErf creates graphopt.Gelu; the driver re-queues it and FuseBiasGelu then takes the Add.
    model = bias_model("erf")
    optimized, report = optimize_with(model, BIAS_RULES, target="ort-cpu")
    assert rewrites(report, "FuseGeluErf") == 1
    assert rewrites(report, "FuseBiasGelu") == 1
    assert _ops(optimized) == [(MS, "BiasGelu")]
    assert list(optimized.graph.node[0].input) == ["x", "bias"]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


def test_bias_add_feeding_the_new_fast_gelu_becomes_its_bias() -> None:
    model = bias_model("tanh")
    optimized, report = optimize_with(model, BIAS_RULES, target="ort-cpu")
    assert rewrites(report, "FuseGeluTanh") == 1
    assert rewrites(report, "FuseBiasGelu") == 1
    assert _ops(optimized) == [(MS, "FastGelu")]
    assert list(optimized.graph.node[0].input) == ["x", "bias"]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind, op", [("erf", (MS, "BiasGelu")), ("tanh", (MS, "FastGelu"))])
def test_bias_gelu_on_ort_cuda_emits_the_op(kind: str, op: tuple[str, str]) -> None:
    optimized, report = optimize_with(bias_model(kind), BIAS_RULES, target="ort-cuda")
    assert rewrites(report, "FuseBiasGelu") == 1
    assert _ops(optimized) == [op]
    assert len(optimized.graph.node[0].input) == 2


@pytest.mark.parametrize("kind", ["erf", "tanh"])
def test_bias_gelu_is_not_fused_for_plain_onnx(kind: str) -> None:
    optimized, report = optimize_with(bias_model(kind), BIAS_RULES, target="onnx")
    assert sum(report.rules[r].applications for r in report.rules) == 0
    assert op_types(optimized)[0] == "Add"


def _only_gelu_fused(kind: str, optimized: onnx.ModelProto, report) -> None:
    assert rewrites(report, "FuseBiasGelu") == 0
    assert rewrites(report, "FuseGeluErf" if kind == "erf" else "FuseGeluTanh") == 1
    gelu = (MS, "Gelu") if kind == "erf" else (MS, "FastGelu")
    assert _ops(optimized) == [("", "Add"), gelu]


@pytest.mark.parametrize("kind", ["erf", "tanh"])
def test_bias_that_is_not_constant_is_not_fused(kind: str) -> None:
    model = bias_model(kind, const=False)
    optimized, report = optimize_with(model, BIAS_RULES, target="ort-cpu")
    _only_gelu_fused(kind, optimized, report)
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["erf", "tanh"])
def test_bias_add_with_a_second_user_is_not_fused(kind: str) -> None:
    model = bias_model(kind)
    model.graph.output.append(helper.make_tensor_value_info("xb", F, None))
    optimized, report = optimize_with(model, BIAS_RULES, target="ort-cpu")
    _only_gelu_fused(kind, optimized, report)
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["erf", "tanh"])
def test_two_dimensional_bias_is_not_fused(kind: str) -> None:
    model = bias_model(kind, bias=np.linspace(-1, 1, 3 * 16).astype(np.float32).reshape(3, 16))
    optimized, report = optimize_with(model, BIAS_RULES, target="ort-cpu")
    _only_gelu_fused(kind, optimized, report)
    assert "rank 2" in report.rules["FuseBiasGelu"].near_misses[0].reason
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


def test_bias_that_broadcasts_over_another_axis_is_not_fused() -> None:
    model = bias_model("erf", bias=np.ones(1, np.float32))
    optimized, report = optimize_with(model, BIAS_RULES, target="ort-cpu")
    _only_gelu_fused("erf", optimized, report)
    assert "expected [16]" in report.rules["FuseBiasGelu"].near_misses[0].reason


# --- FuseQuickGelu ---------------------------------------------------------------


def quick_gelu(alpha: float = 1.702) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Mul", ["alpha", "x"], ["ax"]),
        helper.make_node("Sigmoid", ["ax"], ["sg"]),
        helper.make_node("Mul", ["x", "sg"], ["y"]),
    ]
    return _model(nodes, [init("alpha", np.array(alpha, np.float32))], 17)


def test_quick_gelu_becomes_contrib_quick_gelu_on_ort_cpu() -> None:
    model = quick_gelu()
    optimized, report = optimize_with(model, ["FuseQuickGelu"], target="ort-cpu")
    assert rewrites(report, "FuseQuickGelu") == 1
    assert _ops(optimized) == [(MS, "QuickGelu")]
    alpha = helper.get_attribute_value(optimized.graph.node[0].attribute[0])
    assert optimized.graph.node[0].attribute[0].name == "alpha" and alpha == pytest.approx(1.702)
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-5)


def test_quick_gelu_on_ort_cuda_emits_the_op() -> None:
    optimized, report = optimize_with(quick_gelu(), ["FuseQuickGelu"], target="ort-cuda")
    assert rewrites(report, "FuseQuickGelu") == 1
    assert _ops(optimized) == [(MS, "QuickGelu")]


def test_quick_gelu_is_not_fused_for_plain_onnx_below_opset_24() -> None:
    optimized, report = optimize_with(quick_gelu(), ["FuseQuickGelu"], target="onnx")
    assert rewrites(report, "FuseQuickGelu") == 0
    assert len(optimized.graph.node) == 3
    reason = report.rules["FuseQuickGelu"].near_misses[0].reason
    assert reason == "target onnx cannot run Swish: the model's opset 17 does not define it"


def test_quick_gelu_becomes_swish_at_opset_24_for_plain_onnx_where_onnxruntime_runs_it() -> None:
    model = quick_gelu()
    model.opset_import[0].version = 24
    model.ir_version = 11
    optimized, report = optimize_with(model, ["FuseQuickGelu"], target="onnx")
    if not ort_has_kernel("Swish", 24):  # onnxruntime 1.32: no Swish kernel, so no Swish
        assert rewrites(report, "FuseQuickGelu") == 0 and len(optimized.graph.node) == 3
        assert "the installed onnxruntime has no Swish kernel" in report.rules["FuseQuickGelu"].near_misses[0].reason
        return
    assert rewrites(report, "FuseQuickGelu") == 1
    assert _ops(optimized) == [("", "Swish")]
    assert optimized.graph.node[0].attribute[0].name == "alpha"
    assert helper.get_attribute_value(optimized.graph.node[0].attribute[0]) == pytest.approx(1.702)
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-5)


def test_quick_gelu_with_a_wrong_constant_does_not_fuse() -> None:
    optimized, report = optimize_with(quick_gelu(alpha=1.5), ["FuseQuickGelu"], target="ort-cpu")
    assert rewrites(report, "FuseQuickGelu") == 0
    assert len(optimized.graph.node) == 3
    assert "expected 1.702" in report.rules["FuseQuickGelu"].near_misses[0].reason


# --- end to end on the tiny GPT-2 exports ----------------------------------------


def _models():
    name = "graphopt_test_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("models.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# Both exporters write NewGELU as Mul(x, 0.5) * (1 + Tanh(0.79788 * (x + 0.044715 * Pow(x, 3)))),
# one per layer (2 layers), with the c_fc bias inside the Gemm (no bias Add to take).
# TorchScript exports opset 17 (-> com.microsoft.FastGelu), dynamo opset 20 (-> Gelu tanh).
GPT2_CASES = [
    ("gpt2-tiny-torchscript", "ort-cpu", "FuseGeluTanh", (MS, "FastGelu")),
    ("gpt2-tiny-torchscript", "ort-cuda", "FuseGeluTanh", (MS, "FastGelu")),
    ("gpt2-tiny-dynamo", "onnx", "FuseGeluTanh", ("", "Gelu")),
    ("gpt2-tiny-dynamo", "ort-cpu", "FuseGeluTanh", ("", "Gelu")),
]


@pytest.mark.parametrize("name, target, rule, op", GPT2_CASES)
def test_tiny_gpt2_gets_its_tanh_gelus_fused(name: str, target: str, rule: str, op: tuple[str, str], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    source = _models().TINY_MODELS[name]()
    assert Counter(n.op_type for n in onnx.load(source).graph.node)["Tanh"] == 2
    out = tmp_path / "out.onnx"
    report = graphopt.optimize_file(source, out, target=target)
    assert report.rules[rule].applications == 2
    for other in ("FuseGeluTanh", "FuseBiasGelu", "FuseQuickGelu"):
        if other != rule:
            assert rewrites(report, other) == 0
    after = Counter((n.domain, n.op_type) for n in onnx.load(out).graph.node)
    assert after[op] == 2
    assert after[("", "Tanh")] == 0
    if target != "ort-cuda":
        result = verify(source, out)
        assert result.passed, result.message


def test_tiny_gpt2_torchscript_keeps_tanh_for_plain_onnx() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    source = _models().TINY_MODELS["gpt2-tiny-torchscript"]()
    optimized, report = graphopt.optimize(onnx.load(source), target="onnx")
    assert rewrites(report, "FuseGeluTanh") == 0
    assert Counter(n.op_type for n in optimized.graph.node)["Tanh"] == 2
