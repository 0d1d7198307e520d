"""--weights as a decision (graphopt/passes/weight_quant_decision.py): the model's MatMuls are quantized
unless the cost table predicts the quantized form no faster for a row class it has entries for; no entry:
quantized as asked. The tables here are fakes; the shipped entries are H100 and CPU decode steps."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.decisions import CostTable, Entry

CUDA = "CUDAExecutionProvider"
K, N = 128, 64


def decoder_step(rows: list, elem: int = TensorProto.FLOAT16) -> onnx.ModelProto:
    """Two projections x @ W1 -> Relu -> @ W2 -> Relu on activations [*rows, K] (a decode step when rows are 1)."""
    rng = np.random.default_rng(0)
    dtype = np.float16 if elem == TensorProto.FLOAT16 else np.float32
    inits = {"W1": rng.standard_normal((K, K)).astype(dtype), "W2": rng.standard_normal((K, N)).astype(dtype)}
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="up"), helper.make_node("Relu", ["h"], ["a"], name="act"),
             helper.make_node("MatMul", ["a", "W2"], ["o"], name="down"), helper.make_node("Relu", ["o"], ["y"], name="out")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, [*rows, K])], [helper.make_tensor_value_info("y", elem, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def table(bits: str, times: dict[str, float], rows: str = "r1") -> CostTable:
    return CostTable([Entry(CUDA, "weights", "MatMul", "f16", {"bits": [bits], "rows": [rows]}, times, per=1, source="test")])


def quantize(model: onnx.ModelProto, weights: str, cost_table: CostTable) -> tuple[onnx.ModelProto, object]:
    return graphopt.optimize(model, target="ort-cuda", weights=weights, weights_keep=["none"], cost_table=cost_table)


def the_decision(report):
    [decision] = [d for d in report.decisions if d.kind == "weights"]
    return decision


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_int8_predicted_slower_keeps_every_weight() -> None:
    # The H100 figures: int8 MatMulNBits slower than the fp16 MatMul at one row.
    out, report = quantize(decoder_step([1, 1]), "int8", table("b8", {"unquantized": 1.0, "int8": 1.14}))
    decision = the_decision(report)
    assert (decision.chosen, decision.baseline, decision.basis) == ("unquantized", "unquantized", "table")
    assert "int8 predicted no faster" in decision.reason
    assert ops(out).count("MatMul") == 2 and "MatMulNBits" not in ops(out)
    layers = report.weight_quantization.layers
    assert [layer.reason for layer in layers] == ["speed_decision", "speed_decision"] and report.weight_quantization.quantized == 0
    assert "predicted no faster quantized" in str(report)


def test_int4_predicted_faster_is_applied() -> None:
    out, report = quantize(decoder_step([1, 1]), "int4", table("b4", {"unquantized": 1.0, "int4": 0.72}))
    assert (the_decision(report).chosen, the_decision(report).basis) == ("int4", "table")
    assert ops(out).count("MatMulNBits") == 2 and report.weight_quantization.quantized == 2


@pytest.mark.parametrize("int8_ms", [0.98, 1.02])
def test_a_gain_inside_the_noise_margin_keeps_the_weights(int8_ms: float) -> None:
    out, report = quantize(decoder_step([1, 1]), "int8", table("b8", {"unquantized": 1.0, "int8": int8_ms}))
    assert the_decision(report).chosen == "unquantized" and "MatMulNBits" not in ops(out)


def test_no_entry_quantizes_as_asked() -> None:
    # An empty table, and an entry for more rows than this model reads.
    for cost_table in (CostTable(), table("b8", {"unquantized": 1.0, "int8": 2.0}, rows="rN")):
        out, report = quantize(decoder_step([1, 1]), "int8", cost_table)
        decision = the_decision(report)
        assert (decision.chosen, decision.basis) == ("int8", "no_entry") and "int8 as asked" in decision.reason
        assert ops(out).count("MatMulNBits") == 2


def test_symbolic_rows_are_judged_where_the_table_has_entries() -> None:
    # batch x seq symbolic: one row (decode) and many (prefill) are both possible; the one-row entry
    # says int8 loses, the many-rows class has none and predicts nothing.
    out, report = quantize(decoder_step(["batch", "seq"]), "int8", table("b8", {"unquantized": 1.0, "int8": 1.14}))
    decision = the_decision(report)
    assert decision.chosen == "unquantized" and "row classes with no entry predict nothing" in decision.reason
    assert "MatMulNBits" not in ops(out)


def test_the_shipped_table_keeps_int8_and_applies_int4_on_ort_cuda_at_one_row() -> None:
    out, report = graphopt.optimize(decoder_step([1, 1]), target="ort-cuda", weights="int8", weights_keep=["none"])
    assert the_decision(report).chosen == "unquantized" and "MatMulNBits" not in ops(out)
    out, report = graphopt.optimize(decoder_step([1, 1]), target="ort-cuda", weights="int4", weights_keep=["none"])
    assert the_decision(report).chosen == "int4" and ops(out).count("MatMulNBits") == 2


def test_target_onnx_has_no_provider_and_no_decision() -> None:
    model = decoder_step([1, 1], elem=TensorProto.FLOAT)
    model.opset_import[0].version = 21
    out, report = graphopt.optimize(model, target="onnx", weights="int8", weights_keep=["none"])
    assert not [d for d in report.decisions if d.kind == "weights"] and ops(out).count("DequantizeLinear") == 2
