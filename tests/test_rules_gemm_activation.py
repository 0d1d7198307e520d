"""Golden tests for gemm_activation.pdll on ONNX models: Gemm + Relu -> graphopt.GemmActivation,
lowered to com.microsoft.FusedGemm on ort-cpu (run here on onnxruntime's CPU provider);
refused where the target has no such kernel (`--target onnx`, ort-cuda) or the kernel no such
activation (GELU), dtype (float16) or form. The torch side: tests/test_torch_lowering_choices.py;
both kinds from one torch module: tests/both_kinds_cases.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, optimize_with, rand, rewrites

RULE = ["FuseGemmActivation"]


def gemm_then(act: str = "Relu", *, trans_b: int = 0, alpha: float = 1.0, dtype=TensorProto.FLOAT, extra_output: bool = False,
              opset: int = 17) -> onnx.ModelProto:
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    w = rand(32, 16) if trans_b else rand(16, 32)
    act_attrs = {"approximate": "tanh"} if act == "Gelu" else {}
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=trans_b, alpha=alpha), helper.make_node(act, ["g"], ["y"], **act_attrs)]
    outputs = [helper.make_tensor_value_info("y", dtype, [6, 32])]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("g", dtype, [6, 32]))
    return make_model(nodes, [helper.make_tensor_value_info("x", dtype, [6, 16])], outputs,
                      [init("w", w.astype(np_dtype)), init("b", rand(32).astype(np_dtype))], opset=opset)


def ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in model.graph.node]


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_relu_becomes_fused_gemm_on_ort_cpu(trans_b: int) -> None:
    model = gemm_then(trans_b=trans_b)
    optimized, report = optimize_with(model, RULE, target="ort-cpu")
    assert rewrites(report, "FuseGemmActivation") == 1
    assert ops(optimized) == [("com.microsoft", "FusedGemm")]
    attrs = {a.name: helper.get_attribute_value(a) for a in optimized.graph.node[0].attribute}
    assert attrs["activation"] == b"Relu" and attrs.get("transB", 0) == trans_b
    assert_same_outputs(model, optimized)


@pytest.mark.parametrize("target", ["onnx", "ort-cuda"])
def test_gemm_relu_stays_where_the_target_has_no_fused_gemm(target: str) -> None:
    optimized, report = optimize_with(gemm_then(), RULE, target=target)
    stats = report.rules["FuseGemmActivation"]
    assert stats.matches == 1 and stats.applications == 0
    assert ops(optimized) == [("", "Gemm"), ("", "Relu")]


def test_tanh_gelu_is_refused_by_the_cpu_kernel() -> None:
    optimized, report = optimize_with(gemm_then("Gelu", opset=20), RULE, target="ort-cpu")
    stats = report.rules["FuseGemmActivation"]
    assert stats.applications == 0 and any("activations are Relu, not GeluTanh" in m.reason for m in stats.near_misses)
    assert ops(optimized) == [("", "Gemm"), ("", "Gelu")]


def test_float16_is_refused_by_the_float32_kernel() -> None:
    _, report = optimize_with(gemm_then(dtype=TensorProto.FLOAT16), RULE, target="ort-cpu")
    stats = report.rules["FuseGemmActivation"]
    assert stats.applications == 0 and any("FusedGemm kernel for f16" in m.reason for m in stats.near_misses)


@pytest.mark.parametrize("kwargs", [{"alpha": 2.0}, {"extra_output": True}], ids=["scaled", "product-read-elsewhere"])
def test_gemm_relu_not_fused(kwargs: dict) -> None:
    model = gemm_then(**kwargs)
    optimized, report = optimize_with(model, RULE, target="ort-cpu")
    assert rewrites(report, "FuseGemmActivation") == 0
    assert ops(optimized) == [("", "Gemm"), ("", "Relu")]
    assert_same_outputs(model, optimized)


def test_fused_gemm_output_matches_numpy() -> None:
    model = gemm_then(trans_b=1)
    optimized, _ = optimize_with(model, RULE, target="ort-cpu")
    from rule_testing import run

    x = rand(6, 16)
    w, b = (onnx.numpy_helper.to_array(i) for i in model.graph.initializer)
    np.testing.assert_allclose(run(optimized, {"x": x})[0], np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-5)
