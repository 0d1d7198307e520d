"""Golden tests for the activations.pdll rules around the standard ops: a bias Add feeding
the opset-20 Gelu (erf or tanh) -> BiasGelu / FastGelu with bias, and SiLU (x * Sigmoid(x))
-> graphopt.QuickGelu {alpha = 1} (com.microsoft.QuickGelu, or Swish at opset 24)."""

from __future__ import annotations

import importlib.util
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from rule_testing import (
    BIAS_ACT_WINS,
    TensorProto,
    assert_same_outputs,
    helper,
    init,
    make_model,
    op_types,
    optimize_with,
    ort_has_kernel,
    rewrites,
)

F = TensorProto.FLOAT
MS = "com.microsoft"
BIAS_RULES = ["FuseGeluErf", "FuseGeluTanh", "FuseBiasGelu"]
D = 16


def _ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in model.graph.node]


def _model(nodes, inits, opset: int = 20, shape=(2, 3, D), extra_inputs=(), extra_outputs=()) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", F, list(shape)), *extra_inputs]
    outputs = [helper.make_tensor_value_info("y", F, None), *extra_outputs]
    model = make_model(nodes, inputs, outputs, inits, opset=opset)
    model.ir_version = 9 if opset < 23 else 11
    return model


def bias_gelu(approximate: str = "none", bias: np.ndarray | None = None, const: bool = True, escapes: bool = False) -> onnx.ModelProto:
    """y = Gelu(x + bias) with the opset-20 Gelu, as the dynamo exporter writes nn.Linear + F.gelu."""
    bias = np.linspace(-1, 1, D).astype(np.float32) if bias is None else bias
    attrs = {} if approximate == "none" else {"approximate": approximate}
    nodes = [helper.make_node("Add", ["x", "bias"], ["xb"]), helper.make_node("Gelu", ["xb"], ["y"], **attrs)]
    extra_inputs = [] if const else [helper.make_tensor_value_info("bias", F, list(bias.shape))]
    extra_outputs = [helper.make_tensor_value_info("xb", F, None)] if escapes else []
    return _model(nodes, [init("bias", bias)] if const else [], extra_inputs=extra_inputs, extra_outputs=extra_outputs)


def bias_gelu_erf_decomposed() -> onnx.ModelProto:
    inits = [init("bias", np.linspace(-1, 1, D).astype(np.float32)), init("one", np.array(1.0, np.float32)),
             init("half", np.array(0.5, np.float32)), init("sq2", np.array(math.sqrt(2.0), np.float32))]
    nodes = [
        helper.make_node("Add", ["x", "bias"], ["xb"]),
        helper.make_node("Div", ["xb", "sq2"], ["xs"]),
        helper.make_node("Erf", ["xs"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["xb", "e1"], ["p"]),
        helper.make_node("Mul", ["p", "half"], ["y"]),
    ]
    return _model(nodes, inits)


# --- FuseBiasGelu (erf form -> BiasGelu, tanh form -> FastGelu with its bias) ---


@pytest.mark.parametrize("approximate, op", [("none", (MS, "BiasGelu")), ("tanh", (MS, "FastGelu"))])
@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_bias_add_feeding_standard_gelu_fuses_on_onnxruntime(approximate: str, op: tuple[str, str], target: str) -> None:
    model = bias_gelu(approximate)
    optimized, report = optimize_with(model, BIAS_RULES, target=target)
    assert rewrites(report, "FuseBiasGelu") == 1
    assert sum(rewrites(report, r) for r in BIAS_RULES) == 1
    assert _ops(optimized) == [op]
    assert list(optimized.graph.node[0].input) == ["x", "bias"]
    assert not optimized.graph.node[0].attribute
    if target == "ort-cpu":
        assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


def test_decomposed_erf_gelu_with_bias_becomes_bias_gelu_in_one_run() -> None:
    # FuseGeluErf makes the standard Gelu (opset 20); the driver re-queues it and FuseBiasGelu takes the Add.
    model = bias_gelu_erf_decomposed()
    optimized, report = optimize_with(model, BIAS_RULES, target="ort-cpu")
    assert rewrites(report, "FuseGeluErf") == 1
    assert rewrites(report, "FuseBiasGelu") == 1
    assert _ops(optimized) == [(MS, "BiasGelu")]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_add_feeding_standard_gelu_stays_for_plain_onnx(approximate: str) -> None:
    optimized, report = optimize_with(bias_gelu(approximate), BIAS_RULES, target="onnx")
    assert sum(rewrites(report, r) for r in BIAS_RULES) == 0
    assert op_types(optimized) == ["Add", "Gelu"]
    wanted = "BiasGelu" if approximate == "none" else "FastGelu"
    assert report.rules["FuseBiasGelu"].near_misses[0].reason == f"target onnx has no lowering for graphopt.{wanted}"


@pytest.mark.parametrize("case", ["not-constant", "second-user", "2-D", "broadcast"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_negative_cases(case: str, approximate: str) -> None:
    if case == "not-constant":
        model = bias_gelu(approximate, const=False)
    elif case == "second-user":
        model = bias_gelu(approximate, escapes=True)
    elif case == "2-D":
        model = bias_gelu(approximate, bias=np.linspace(-1, 1, 3 * D).astype(np.float32).reshape(3, D))
    else:
        model = bias_gelu(approximate, bias=np.ones(1, np.float32))
    optimized, report = optimize_with(model, BIAS_RULES, target="ort-cpu")
    assert sum(rewrites(report, r) for r in BIAS_RULES) == 0
    assert op_types(optimized) == ["Add", "Gelu"]
    reason = report.rules["FuseBiasGelu"].near_misses[0].reason
    expected = {"not-constant": "not a constant", "second-user": "produces a graph output", "2-D": "rank 2", "broadcast": "expected [16]"}[case]
    assert expected in reason, reason
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


def test_erf_gelu_is_not_taken_as_tanh() -> None:
    # One rule serves both forms: the standard Gelu's `approximate` picks the fused op.
    model = bias_gelu("none")
    optimized, report = optimize_with(model, ["FuseBiasGelu"], target="ort-cpu")
    assert rewrites(report, "FuseBiasGelu") == 1
    assert _ops(optimized) == [(MS, "BiasGelu")]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


# --- FuseSiLU ------------------------------------------------------------------------


def silu(opset: int = 17, other: bool = False, escapes: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("Sigmoid", ["z" if other else "x"], ["sg"]), helper.make_node("Mul", ["x", "sg"], ["y"])]
    extra_inputs = [helper.make_tensor_value_info("z", F, [2, 3, D])] if other else []
    extra_outputs = [helper.make_tensor_value_info("sg", F, None)] if escapes else []
    return _model(nodes, [], opset=opset, extra_inputs=extra_inputs, extra_outputs=extra_outputs)


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_silu_becomes_quick_gelu_with_alpha_1_on_onnxruntime(target: str) -> None:
    model = silu()
    optimized, report = optimize_with(model, ["FuseSiLU"], target=target)
    assert rewrites(report, "FuseSiLU") == 1
    assert _ops(optimized) == [(MS, "QuickGelu")]
    (attr,) = optimized.graph.node[0].attribute
    assert attr.name == "alpha" and helper.get_attribute_value(attr) == 1.0
    if target == "ort-cpu":
        assert_same_outputs(model, optimized, rtol=1e-5, atol=1e-6)


def test_silu_becomes_swish_at_opset_24_for_plain_onnx_where_onnxruntime_runs_it() -> None:
    model = silu(opset=24)
    optimized, report = optimize_with(model, ["FuseSiLU"], target="onnx")
    if not ort_has_kernel("Swish", 24):  # onnxruntime 1.32: no Swish kernel, so no Swish
        assert rewrites(report, "FuseSiLU") == 0 and op_types(optimized) == ["Sigmoid", "Mul"]
        assert "the installed onnxruntime has no Swish kernel" in report.rules["FuseSiLU"].near_misses[0].reason
        return
    assert rewrites(report, "FuseSiLU") == 1
    assert _ops(optimized) == [("", "Swish")]
    onnx.checker.check_model(optimized, full_check=True)
    assert_same_outputs(model, optimized, rtol=1e-5, atol=1e-6)


def test_silu_is_not_fused_for_plain_onnx_below_opset_24() -> None:
    optimized, report = optimize_with(silu(), ["FuseSiLU"], target="onnx")
    assert rewrites(report, "FuseSiLU") == 0
    assert op_types(optimized) == ["Sigmoid", "Mul"]
    assert "opset 17 does not define it" in report.rules["FuseSiLU"].near_misses[0].reason


@pytest.mark.parametrize("case", ["sigmoid-of-another-value", "sigmoid-has-another-user"])
def test_silu_negative_cases(case: str) -> None:
    model = silu(other=case == "sigmoid-of-another-value", escapes=case == "sigmoid-has-another-user")
    optimized, report = optimize_with(model, ["FuseSiLU"], target="ort-cpu")
    assert rewrites(report, "FuseSiLU") == 0
    assert op_types(optimized) == ["Sigmoid", "Mul"]


# --- end to end: tiny BERT / GPT-2 dynamo exports (opset 20) -----------------------------


def _models():
    name = "graphopt_test_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("models.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# BERT's intermediate dense is nn.Linear on [batch, seq, hidden]: MatMul + Add(bias) + Gelu, one
# per layer (2 layers). GPT-2's c_fc is a Gemm with its bias inside: nothing for the bias rules,
# its tanh GELU becomes Gelu(tanh) (FuseGeluTanh) and stays the standard op.
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("target", ["ort-cpu", "onnx"])
def test_tiny_bert_dynamo_gets_bias_gelu(target: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import graphopt
    from graphopt.verify import verify

    source = _models().TINY_MODELS["bert-tiny-dynamo"]()
    optimized, report = graphopt.optimize(onnx.load(source), target=target)
    after = Counter((n.domain, n.op_type) for n in optimized.graph.node)
    if target == "ort-cpu":
        assert rewrites(report, "FuseBiasGelu") == 2
        # The shipped CPU table measures Gemm + Gelu faster at these shapes: the bias goes back
        # before the activation (graphopt/passes/bias_act.py), for onnxruntime to fold into a Gemm.
        assert after[(MS, "BiasGelu")] == 0 and after[(MS, "Gelu")] == 2 and after[("", "Gelu")] == 0
        assert [d.chosen for d in report.decisions if d.kind == "bias_act"] == ["unfused", "unfused"]
        fused, _ = graphopt.optimize(onnx.load(source), target=target, cost_table=BIAS_ACT_WINS)
        assert Counter((n.domain, n.op_type) for n in fused.graph.node)[(MS, "BiasGelu")] == 2
        fused_result = verify(source, fused)
        assert fused_result.passed, fused_result.message
    else:
        assert rewrites(report, "FuseBiasGelu") == 0
        assert after[("", "Gelu")] == 2
    result = verify(source, optimized)
    assert result.passed, result.message


@pytest.mark.filterwarnings("ignore")
def test_tiny_gpt2_dynamo_has_no_bias_gelu() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import graphopt

    source = _models().TINY_MODELS["gpt2-tiny-dynamo"]()
    optimized, report = graphopt.optimize(onnx.load(source), target="ort-cpu")
    assert rewrites(report, "FuseGeluTanh") == 2
    assert rewrites(report, "FuseBiasGelu") == 0
    assert Counter(n.op_type for n in optimized.graph.node)["Gelu"] == 2
